// Package instrument is the one wrapper between shop's services and its
// lock backend. Each acquisition crosses it once, and it does three
// things there:
//
//   - admission: it bounds, per key and per process, the requests waiting,
//     and turns away at once a wait expected to outlast its timeout;
//   - metrics: how long acquisitions wait, how long leases are held, how
//     many leases are lost behind their holder's back (Metrics);
//   - tracing: a span for each lock wait (the backend's own calls nest in
//     it) and one for each lock hold (what runs under the lock nests in it,
//     through lockkit.Do).
//
// Admission sits inside the measurements, so that its refusals count and
// show as lock-busy, like a wait timeout.
//
// The leases it hands out must be released (lockkit.Do always does): a
// lease's hold time, its loss and its span are recorded at its release,
// which costs no goroutine per lease. Each acquisition is labelled by the
// class it names (lockkit.WithClass, lockkit.WithKeyClass; package guard
// names each key's), never by the key: the key names a user or a SKU.
package instrument

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

const tracerName = "github.com/lockbench/shop/internal/lockkit/instrument"

// Options configure Wrap.
type Options struct {
	// Backend is the backend's config name, which labels metrics and spans.
	Backend string
	// Metrics counts the acquisitions; nil counts nothing.
	Metrics *Metrics
	// MaxWaiters bounds the waiters per key in this process; 0: no bound.
	MaxWaiters int
}

// Wrap returns next admitted, measured and traced as Options say.
func Wrap(next lockkit.Locker, o Options) lockkit.Locker {
	return &locker{next: next, name: o.Backend, metrics: o.Metrics, admission: newAdmission(o.MaxWaiters)}
}

type locker struct {
	next      lockkit.Locker
	name      string
	metrics   *Metrics
	admission *admission
}

// Acquire waits in this process's line for key, then for the backend.
func (l *locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return l.measure(ctx, key, opts, l.waitInLine)
}

// TryAcquire never waits, so admission has nothing to bound.
func (l *locker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return l.measure(ctx, key, opts, func(ctx context.Context, key string, opts []lockkit.Option) (lockkit.Lease, *queue, error) {
		lease, err := l.next.TryAcquire(ctx, key, opts...)
		return lease, nil, err
	})
}

func (l *locker) Close() error { return l.next.Close() }

// Capabilities passes the backend's declaration through.
func (l *locker) Capabilities() lockkit.Capabilities { return lockkit.CapabilitiesOf(l.next) }

// waitInLine asks the backend for key if admission lets the request wait.
func (l *locker) waitInLine(ctx context.Context, key string, opts []lockkit.Option) (lockkit.Lease, *queue, error) {
	o, _ := backend.Resolve(opts)
	q, err := l.admission.enter(key, o.WaitTimeout)
	if err != nil {
		return nil, nil, err
	}
	lease, err := l.next.Acquire(ctx, key, opts...)
	l.admission.leave(q, err == nil)
	if err != nil {
		return nil, nil, err
	}
	return lease, q, nil
}

// measure runs take as one lock wait (its span, its time or its failure),
// and hands out the granted lease as one lock hold.
func (l *locker) measure(ctx context.Context, key string, opts []lockkit.Option,
	take func(context.Context, string, []lockkit.Option) (lockkit.Lease, *queue, error)) (lockkit.Lease, error) {
	class := lockkit.ClassOf(key, opts)
	tracer := otel.Tracer(tracerName)
	attrs := []attribute.KeyValue{attribute.String("lock.backend", l.name), attribute.String("lock.class", classAttr(class))}
	waitCtx, wait := tracer.Start(ctx, "lock wait", trace.WithAttributes(attrs...))
	start := time.Now()
	inner, q, err := take(waitCtx, key, opts)
	held := time.Now()
	wait.SetAttributes(attribute.Float64("lock.waited_ms", float64(held.Sub(start).Microseconds())/1000),
		attribute.String("lock.outcome", outcome(err)))
	if err != nil {
		l.metrics.failed(class, outcome(err))
		wait.RecordError(err)
		wait.SetStatus(codes.Error, outcome(err))
		wait.End()
		return nil, err
	}
	l.metrics.waited(class, held.Sub(start))
	fence := attribute.Int64("lock.fence", int64(inner.Fence()))
	wait.SetAttributes(fence)
	wait.End()
	_, hold := tracer.Start(ctx, "lock hold", trace.WithAttributes(append(attrs, fence)...))
	return &lease{Lease: inner, locker: l, class: class, queue: q, held: held, span: hold}, nil
}

// classAttr is the lock.class of an acquisition that named class; one
// that named none is "other", as in the metrics.
func classAttr(class string) string {
	if class == "" {
		return "other"
	}
	return class
}

// outcome is how an acquisition ended: the lock.outcome of its span, and
// the reason its failure is counted under.
func outcome(err error) string {
	switch {
	case err == nil:
		return "granted"
	case errors.Is(err, lockkit.ErrNotAcquired):
		return "busy"
	case errors.Is(err, lockkit.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "cancelled"
	}
	return "error"
}

type lease struct {
	lockkit.Lease
	locker *locker
	class  string
	queue  *queue // nil: granted without waiting in line (TryAcquire)
	held   time.Time
	span   trace.Span
	once   sync.Once
}

// HoldContext puts the hold's span in ctx, so that what runs under the
// lock (lockkit.Do's fn: its SQL, its Redis commands) is traced inside it.
func (l *lease) HoldContext(ctx context.Context) context.Context {
	return trace.ContextWithSpan(ctx, l.span)
}

// Release records the hold: its time, and its loss if Lost had closed
// before its holder let go.
func (l *lease) Release(ctx context.Context) error {
	first := false
	l.once.Do(func() { first = true })
	if !first {
		return l.Lease.Release(ctx)
	}
	lost := closed(l.Lease.Lost())
	l.locker.metrics.held(l.class, time.Since(l.held), lost)
	if lost {
		l.span.SetAttributes(attribute.String("lock.outcome", "lost"))
		l.span.SetStatus(codes.Error, "lease lost before release")
	} else {
		l.span.SetAttributes(attribute.String("lock.outcome", "released"))
	}
	err := l.Lease.Release(ctx)
	l.span.End()
	if l.queue != nil {
		l.locker.admission.released(l.queue, l.held)
	}
	return err
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// metric label of an acquisition's class.
func metricClass(class string) string { return label(lockkey.Class(class)) }
