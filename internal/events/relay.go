package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
)

// LeaderKey is the relay's leader lease: every instance runs the relay
// loop, only the holder publishes. With the none backend every instance
// does, and the broker's deduplication is all that stands between them.
var LeaderKey = lockkey.EventRelay.Key()

// Defaults of RelayOptions (SHOP_EVENTS_RELAY_* defaults).
const (
	DefaultRelayInterval   = 200 * time.Millisecond
	DefaultRelayBatch      = 256
	DefaultRelayMaxBackoff = 5 * time.Second
	DefaultPublishTimeout  = 5 * time.Second
)

// RelayOptions configure NewRelay.
type RelayOptions struct {
	Outbox *Outbox
	JS     jetstream.JetStream
	// Locker grants the leader lease; its tokens fence the marks.
	Locker lockkit.Locker
	// LeaderTTL is the lease, renewed while the relay lives
	// (default lockkit.DefaultLeaseTTL).
	LeaderTTL time.Duration
	// Interval is the wait between two looks at an empty outbox; a commit
	// in this process wakes the relay at once (Wake).
	Interval time.Duration
	// Batch is the most events published before their acks are awaited.
	Batch int
	// MaxBackoff bounds the wait after a failed publish, which doubles
	// from Interval.
	MaxBackoff time.Duration
	// PublishTimeout bounds the wait for a batch's acks.
	PublishTimeout time.Duration
	Stream         StreamOptions
	Metrics        *Metrics
	Log            *slog.Logger
}

// RetrySpan is the longest an event can sit between a publish the broker
// stored and the republish of it by this relay or its successor: a batch's
// ack wait, the backoff before the retry, and a dead leader's lease
// running out before another takes over. The stream's duplicate window
// must cover it, or such a republish is stored twice.
func (o RelayOptions) RetrySpan() time.Duration {
	return o.PublishTimeout + o.MaxBackoff + o.LeaderTTL
}

func (o *RelayOptions) defaults() {
	if o.LeaderTTL <= 0 {
		o.LeaderTTL = lockkit.DefaultLeaseTTL
	}
	if o.Interval <= 0 {
		o.Interval = DefaultRelayInterval
	}
	if o.Batch <= 0 {
		o.Batch = DefaultRelayBatch
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = DefaultRelayMaxBackoff
	}
	if o.PublishTimeout <= 0 {
		o.PublishTimeout = DefaultPublishTimeout
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// Relay publishes the outbox to JetStream. Run it on every instance; the
// leader lease lets one at a time publish.
type Relay struct {
	o    RelayOptions
	wake chan struct{}
	// afterPublish, when set by a test, runs after a batch was
	// acknowledged and before it is marked; an error stops the round
	// there, unmarked, as a relay killed in that window would.
	afterPublish func() error
	// streamReady is set once the stream was created or updated, and
	// cleared by a failed publish; direct delivery publishes from many
	// requests at once.
	streamReady atomic.Bool
}

// NewRelay returns a relay; Run starts it.
func NewRelay(o RelayOptions) *Relay {
	o.defaults()
	o.Stream.defaults()
	return &Relay{o: o, wake: make(chan struct{}, 1)}
}

// Wake tells the relay that a change committed: it looks at the outbox now
// rather than after Interval. It never blocks.
func (r *Relay) Wake() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// errPublish marks a round that failed at the broker: the relay backs off.
var errPublish = errors.New("publish")

// Run relays until ctx ends: it tries the leader lease and, holding it,
// claims the relay's fence with the lease's token and publishes until the
// outbox is empty, then lets the lease go and waits. Like the order
// closer it holds the lease only while there is work: on some backends a
// held lease is a held resource. A lost lease cancels the drain; a mark
// it had in flight is refused by the fence.
func (r *Relay) Run(ctx context.Context) {
	backoff := time.Duration(0)
	leading := false
	for ctx.Err() == nil {
		err := lockkit.Do(ctx, tryOnly{r.o.Locker}, LeaderKey.String(), func(ctx context.Context, fence uint64) error {
			if !leading {
				r.o.Log.Info("event relay: leading", "key", LeaderKey.String(), "fence", fence)
				leading = true
			}
			if err := r.o.Outbox.Claim(ctx, fence); err != nil {
				return err
			}
			return r.drain(ctx, fence)
		}, lockkit.WithAutoRenew(r.o.LeaderTTL), lockkit.WithClass(string(LeaderKey.Class())))
		if ctx.Err() != nil {
			return
		}
		switch {
		case err == nil:
			backoff = 0
		case errors.Is(err, lockkit.ErrNotAcquired) || errors.Is(err, lockkit.ErrLeaseLost) || errors.Is(err, lockkit.ErrFenced):
			if leading {
				r.o.Log.Info("event relay: stepped down", "key", LeaderKey.String(), "reason", err)
			}
			leading = false
		default:
			backoff = min(max(2*backoff, r.o.Interval), r.o.MaxBackoff)
			r.o.Log.Warn("event relay: round", "err", err, "retry_in", backoff)
		}
		r.sleep(ctx, max(backoff, r.o.Interval), backoff == 0)
	}
}

// sleep waits d, or less when wakeable and a commit wakes it.
func (r *Relay) sleep(ctx context.Context, d time.Duration, wakeable bool) {
	t := time.NewTimer(d)
	defer t.Stop()
	var wake <-chan struct{}
	if wakeable {
		wake = r.wake
	}
	select {
	case <-t.C:
	case <-wake:
	case <-ctx.Done():
	}
}

// drain publishes rounds until the outbox is empty.
func (r *Relay) drain(ctx context.Context, fence uint64) error {
	for ctx.Err() == nil {
		n, err := r.Round(ctx, fence)
		if err != nil || n == 0 {
			return err
		}
	}
	return context.Cause(ctx)
}

// Round publishes one batch of the backlog and marks what the broker
// acknowledged, fenced with fence, and returns how many it marked. A
// duplicate acknowledgement (the broker already had that Nats-Msg-Id)
// counts as one. Run calls it as the leader; tests call it to relay now.
func (r *Relay) Round(ctx context.Context, fence uint64) (int, error) {
	if err := r.ensureStream(ctx); err != nil {
		return 0, err
	}
	rows, err := r.o.Outbox.Unpublished(ctx, r.o.Batch)
	if err != nil || len(rows) == 0 {
		return 0, err
	}
	acked, err := r.publish(ctx, rows)
	if len(acked) > 0 {
		if r.afterPublish != nil {
			if err := r.afterPublish(); err != nil {
				return 0, err
			}
		}
		if merr := r.o.Outbox.MarkPublished(context.WithoutCancel(ctx), fence, acked); merr != nil {
			return 0, merr
		}
	}
	return len(acked), err
}

func (r *Relay) ensureStream(ctx context.Context) error {
	if r.streamReady.Load() {
		return nil
	}
	if err := EnsureStream(ctx, r.o.JS, r.o.Stream); err != nil {
		r.o.Metrics.publishFailed()
		return fmt.Errorf("%w: %w", errPublish, err)
	}
	r.streamReady.Store(true)
	return nil
}

// publish sends rows at once and waits for their acks, and returns the
// seqs acknowledged, in order.
func (r *Relay) publish(ctx context.Context, rows []OutboxRow) ([]int64, error) {
	futures := make([]jetstream.PubAckFuture, 0, len(rows))
	spans := make([]trace.Span, 0, len(rows))
	defer func() {
		for _, s := range spans {
			s.End()
		}
	}()
	var errs []error
	for _, row := range rows {
		msg, span := r.message(ctx, row)
		spans = append(spans, span)
		f, err := r.o.JS.PublishMsgAsync(msg, jetstream.WithMsgID(row.EventID), jetstream.WithExpectStream(r.o.Stream.Name))
		if err != nil {
			errs = append(errs, err)
			span.SetStatus(codes.Error, err.Error())
			break
		}
		futures = append(futures, f)
	}
	timeout := time.NewTimer(r.o.PublishTimeout)
	defer timeout.Stop()
	var acked []int64
	for i, f := range futures {
		select {
		case ack := <-f.Ok():
			acked = append(acked, rows[i].Seq)
			r.o.Metrics.published(ack.Duplicate)
		case err := <-f.Err():
			errs = append(errs, err)
			spans[i].SetStatus(codes.Error, err.Error())
		case <-timeout.C:
			errs = append(errs, fmt.Errorf("no ack within %s", r.o.PublishTimeout))
			// Every later future has had as long: give up the batch.
			return acked, r.failed(errs, len(rows)-len(acked))
		case <-ctx.Done():
			return acked, context.Cause(ctx)
		}
	}
	if len(errs) > 0 {
		return acked, r.failed(errs, len(rows)-len(acked))
	}
	return acked, nil
}

func (r *Relay) failed(errs []error, n int) error {
	for range n {
		r.o.Metrics.publishFailed()
	}
	// A stream deleted or changed under the relay is created again.
	r.streamReady.Store(false)
	return fmt.Errorf("%w: %d of the batch failed: %w", errPublish, n, errors.Join(errs...))
}

var tracer = otel.Tracer("github.com/lockbench/shop/internal/events")

// message is row as a JetStream message, and the span of its publish: a
// child of the request that made the change (row.Traceparent), whose
// context travels in the headers so that the consumer's span is its child.
func (r *Relay) message(ctx context.Context, row OutboxRow) (*nats.Msg, trace.Span) {
	tc := propagation.TraceContext{}
	subject := r.o.Stream.SubjectPrefix + row.Type
	parent := tc.Extract(context.WithoutCancel(ctx), propagation.MapCarrier{"traceparent": row.Traceparent})
	pctx, span := tracer.Start(parent, "publish "+subject, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attribute.String("messaging.system", "nats"),
			attribute.String("messaging.destination.name", subject),
			attribute.String("messaging.message.id", row.EventID)))
	msg := nats.NewMsg(subject)
	msg.Data = row.Payload
	tc.Inject(pctx, propagation.HeaderCarrier(msg.Header))
	if msg.Header.Get("traceparent") == "" && row.Traceparent != "" {
		// No tracer provider: pass the request's context on unchanged.
		msg.Header.Set("traceparent", row.Traceparent)
	}
	return msg, span
}

// tryOnly makes a Locker's Acquire a TryAcquire: a relay round is not worth
// waiting for, the leader is already publishing.
type tryOnly struct{ lockkit.Locker }

func (t tryOnly) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return t.TryAcquire(ctx, key, opts...)
}
