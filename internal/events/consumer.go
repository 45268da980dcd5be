package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/lockkit"
)

// Effect is what a consumer does with an event. Its writes go through tx,
// the transaction the Dedup opened, so that the dedup record and the
// effect commit or roll back together.
type Effect interface {
	// Handles reports whether events of type typ have an effect; the other
	// order types are acked without one.
	Handles(typ string) bool
	// Apply writes the effect of e in tx. A Rejection (Reject) dead-letters
	// e at once; any other error is retried with the consumer's backoff.
	Apply(ctx context.Context, tx *gorm.DB, e Event) error
}

// ConsumerOptions are a consumer's settings; docs/config.md says why each
// default is what it is.
type ConsumerOptions struct {
	// Name is the durable consumer's name and the inbox's consumer column.
	Name string
	// Stream and FilterSubject default to Stream and Subjects; tests that
	// share a server set their own.
	Stream, FilterSubject string
	// AckWait is how long a delivery may go unacknowledged before
	// JetStream delivers it again (to this or another consumer process).
	AckWait time.Duration
	// MaxDeliver bounds the deliveries of one message; the last failure is
	// dead-lettered.
	MaxDeliver int
	Dedup      Dedup
	Store      *ConsumerStore
	Effect     Effect
	Metrics    *ConsumerMetrics // nil: not counted
	Log        *slog.Logger
}

// Backoff is the redelivery schedule of a message whose effect failed, or
// whose ack never came: AckWait, then doubling, one entry per redelivery
// up to MaxDeliver. Its first entry is AckWait because JetStream uses a
// BackOff's first entry as the AckWait.
func (o ConsumerOptions) Backoff() []time.Duration {
	out := make([]time.Duration, 0, o.MaxDeliver)
	d := o.AckWait
	for range max(o.MaxDeliver-1, 1) {
		out = append(out, d)
		d = min(2*d, 10*o.AckWait)
	}
	return out
}

// Config is the durable pull consumer's JetStream configuration.
func (o ConsumerOptions) Config() jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       o.Name,
		Description:   "shop " + o.Name + ": applies order events once (docs/events.md)",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       o.AckWait,
		MaxDeliver:    o.MaxDeliver,
		BackOff:       o.Backoff(),
		FilterSubject: o.FilterSubject,
		// Across every process sharing the durable. Each process fetches
		// one message at a time (Run), so a paused one holds back one.
		MaxAckPending: 256,
	}
}

// Consumer applies the events of the stream through its Effect, once per
// event as far as its Dedup makes it.
type Consumer struct {
	o ConsumerOptions
	// afterCommit, when set by a test, runs after the effect committed and
	// before the ack: where a crash leaves an applied, unacked message.
	afterCommit func(Event)
}

// NewConsumer returns a consumer with o's settings.
func NewConsumer(o ConsumerOptions) (*Consumer, error) {
	switch {
	case o.Name == "" || strings.ContainsAny(o.Name, ".*> "):
		return nil, fmt.Errorf("events: consumer name %q must be non-empty, without '.', '*', '>' or spaces", o.Name)
	case o.AckWait <= 0 || o.MaxDeliver < 1:
		return nil, fmt.Errorf("events: consumer %s needs AckWait > 0 and MaxDeliver >= 1", o.Name)
	case o.Dedup == nil || o.Store == nil || o.Effect == nil:
		return nil, fmt.Errorf("events: consumer %s needs a Dedup, a Store and an Effect", o.Name)
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
	if o.Stream == "" {
		o.Stream, o.FilterSubject = Stream, Subjects
	}
	return &Consumer{o: o}, nil
}

// Run consumes until ctx ends. It waits for the stream (the relay creates
// it) and creates or updates its durable consumer; then it fetches and
// handles one message at a time. It returns nil when ctx ends (within
// fetchWait).
//
// One at a time, with no pull outstanding while a message is handled: a
// pull left open would let the server hand this process the redelivery of
// the message it is stuck on, and a paused process would hold it too.
func (c *Consumer) Run(ctx context.Context, js jetstream.JetStream) error {
	cons, err := c.attach(ctx, js)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	for ctx.Err() == nil {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(fetchWait))
		if err != nil {
			c.o.Log.Warn("fetch", "consumer", c.o.Name, "err", err)
			sleep(ctx, time.Second)
			continue
		}
		for msg := range batch.Messages() {
			c.Handle(ctx, msg)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) && ctx.Err() == nil {
			c.o.Log.Warn("fetch", "consumer", c.o.Name, "err", err)
			sleep(ctx, time.Second)
		}
	}
	return nil
}

// fetchWait is how long one pull waits for a message: the idle poll, and
// the longest Run takes to notice its ctx ended.
const fetchWait = time.Second

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// attach waits for the stream, retrying with backoff, and returns the
// durable consumer, created or updated to c's settings.
func (c *Consumer) attach(ctx context.Context, js jetstream.JetStream) (jetstream.Consumer, error) {
	wait := 100 * time.Millisecond
	for {
		cons, err := js.CreateOrUpdateConsumer(ctx, c.o.Stream, c.o.Config())
		if err == nil {
			c.o.Log.Info("consuming", "consumer", c.o.Name, "stream", c.o.Stream, "ack_wait", c.o.AckWait,
				"max_deliver", c.o.MaxDeliver)
			return cons, nil
		}
		// A broker that is down or still starting, or a stream the relay
		// has not created yet, is waited for; settings the broker refuses
		// are a configuration error.
		if BrokerRefused(err) && !errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("events: consumer %s on stream %s: %w", c.o.Name, c.o.Stream, err)
		}
		c.o.Log.Info("waiting for the stream", "consumer", c.o.Name, "stream", c.o.Stream, "err", err, "retry_in", wait)
		if sleep(ctx, wait); ctx.Err() != nil {
			return nil, ctx.Err()
		}
		wait = min(2*wait, 5*time.Second)
	}
}

// Handle decides one delivery: ack (applied, duplicate, or no effect for
// its type), dead letter and terminate (undecodable, unknown type,
// rejected, or failed on its last delivery), or nak with the backoff.
func (c *Consumer) Handle(ctx context.Context, msg jetstream.Msg) {
	meta, err := msg.Metadata()
	if err != nil {
		// Not a JetStream message: nothing to ack.
		c.o.Log.Warn("message without JetStream metadata", "consumer", c.o.Name, "subject", msg.Subject())
		return
	}
	ctx = otel.GetTextMapPropagator().Extract(ctx, headerCarrier(msg.Headers()))
	ctx, span := otel.Tracer("github.com/lockbench/shop/internal/events").Start(ctx, "consume "+msg.Subject(),
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attribute.String("messaging.system", "nats"),
			attribute.String("messaging.destination.name", msg.Subject()),
			attribute.String("messaging.consumer.group.name", c.o.Name),
			attribute.Int64("messaging.nats.delivered", int64(meta.NumDelivered))))
	defer span.End()

	c.o.Metrics.consumed(c.o.Name)
	if meta.NumDelivered > 1 {
		c.o.Metrics.redelivered(c.o.Name)
	}
	outcome, err := c.handle(ctx, msg, meta)
	span.SetAttributes(attribute.String("shop.outcome", outcome))
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
}

// handle returns what became of the delivery, for the span.
func (c *Consumer) handle(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata) (string, error) {
	var e Event
	if err := json.Unmarshal(msg.Data(), &e); err != nil {
		return c.deadLetter(ctx, msg, meta, Event{}, rejection(ReasonUndecodable, "%v", err))
	}
	span := trace.SpanFromContext(ctx)
	span.SetAttributes(attribute.String("shop.event_id", e.ID))
	if !slices.Contains([]string{TypeOrderPlaced, TypeOrderPaid, TypeOrderCancelled}, e.Type) {
		return c.deadLetter(ctx, msg, meta, e, rejection(ReasonUnknownType, "type %q", e.Type))
	}
	if e.ID == "" || e.OrderID <= 0 || e.ID != ID(e.OrderID, e.Type) {
		return c.deadLetter(ctx, msg, meta, e, rejection(ReasonInvalid, "id %q does not name order %d's %s", e.ID, e.OrderID, e.Type))
	}
	if !c.o.Effect.Handles(e.Type) {
		return "no-effect", c.ack(ctx, msg)
	}
	err := c.o.Dedup.Apply(ctx, c.o.Name, e.ID, func(tx *gorm.DB) error { return c.o.Effect.Apply(ctx, tx, e) })
	var rejected *Rejection
	switch {
	case err == nil:
		c.o.Metrics.applied(c.o.Name)
		if c.afterCommit != nil {
			c.afterCommit(e)
		}
		return "applied", c.ack(ctx, msg)
	case errors.Is(err, ErrDuplicate):
		c.o.Metrics.duplicate(c.o.Name)
		return "duplicate", c.ack(ctx, msg)
	case errors.As(err, &rejected):
		return c.deadLetter(ctx, msg, meta, e, rejected)
	case errors.Is(err, lockkit.ErrFenced):
		// A newer holder of the event's lock has this message now; its
		// delivery decides the ack.
		c.o.Metrics.fenced(c.o.Name)
		c.o.Log.Info("stale holder refused", "consumer", c.o.Name, "event", e.ID, "err", err)
		return "fenced", err
	}
	if meta.NumDelivered >= uint64(c.o.MaxDeliver) {
		return c.deadLetter(ctx, msg, meta, e, rejection(ReasonMaxDeliveries, "%d deliveries, last: %v", meta.NumDelivered, err))
	}
	c.o.Log.Warn("effect failed, will retry", "consumer", c.o.Name, "event", e.ID, "delivered", meta.NumDelivered, "err", err)
	backoff := c.o.Backoff()
	return "retry", errors.Join(err, msg.NakWithDelay(backoff[min(int(meta.NumDelivered), len(backoff))-1]))
}

func rejection(reason, format string, args ...any) *Rejection {
	return &Rejection{Reason: reason, Detail: fmt.Sprintf(format, args...)}
}

// deadLetter records the message with its reason, then terminates it so
// that JetStream never delivers it again. If the record cannot be written
// the message is left to be redelivered: a dead letter is never lost.
func (c *Consumer) deadLetter(ctx context.Context, msg jetstream.Msg, meta *jetstream.MsgMetadata, e Event, r *Rejection) (string, error) {
	err := c.o.Store.addDeadLetter(ctx, DeadLetter{Consumer: c.o.Name, EventID: e.ID, Subject: msg.Subject(),
		StreamSeq: meta.Sequence.Stream, Deliveries: meta.NumDelivered, Reason: r.Reason, Detail: r.Detail, Payload: string(msg.Data())})
	if err != nil {
		c.o.Log.Error("dead letter not recorded; left for redelivery", "consumer", c.o.Name, "event", e.ID, "err", err)
		return "retry", err
	}
	c.o.Metrics.deadLettered(c.o.Name, r.Reason)
	c.o.Log.Warn("dead-lettered", "consumer", c.o.Name, "event", e.ID, "stream_seq", meta.Sequence.Stream,
		"reason", r.Reason, "detail", r.Detail)
	return "dead-letter", msg.TermWithReason(r.Reason)
}

// ack confirms with the server (a double ack): an ack lost on the way
// would otherwise look like success here and redeliver later.
func (c *Consumer) ack(ctx context.Context, msg jetstream.Msg) error {
	actx, cancel := context.WithTimeout(ctx, c.o.AckWait)
	defer cancel()
	return msg.DoubleAck(actx)
}

// headerCarrier reads and writes the trace context in NATS headers,
// matching names without regard to case: NATS keeps them as written, and
// producers differ (the relay's propagation.HeaderCarrier writes
// "Traceparent", other clients "traceparent").
type headerCarrier nats.Header

func (h headerCarrier) Get(key string) string {
	for k, v := range h {
		if strings.EqualFold(k, key) && len(v) > 0 {
			return v[0]
		}
	}
	return ""
}

func (h headerCarrier) Set(key, value string) { h[key] = []string{value} }

func (h headerCarrier) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}
