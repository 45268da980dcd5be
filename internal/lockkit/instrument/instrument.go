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
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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
	lost := backend.IsClosed(l.Lease.Lost())
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

// metric label of an acquisition's class.
func metricClass(class string) string { return label(lockkey.Class(class)) }

// label is the label value of class c: its name, so that a class
// declared in lockkey is labelled without a change here. The closer's
// leader lease keeps "other", its label from before classes were
// declared: dashboards and alerts select on these values.
func label(c lockkey.Class) string {
	if c == "" || c == lockkey.OrderCloser {
		return "other"
	}
	return string(c)
}

// Metrics holds the collectors of one backend: how long acquisitions wait,
// how long leases are held, how many leases are lost behind their holder's
// back, and (reported by the stores) how many writes a fence refused.
// Create it once per process.
//
// They are labelled by backend and by key class (stock, account, like,
// order; the leader lease, and a key taken without a class, is "other"),
// never by the key itself: one series per SKU or account would grow
// without bound.
type Metrics struct {
	backend  string
	wait     *prometheus.HistogramVec
	hold     *prometheus.HistogramVec
	failures *prometheus.CounterVec
	lost     *prometheus.CounterVec
	fenced   *prometheus.CounterVec
}

// NewMetrics registers the lock metrics with reg, labelled with backend.
// It panics if they are already registered there, as
// prometheus.MustRegister does.
func NewMetrics(reg prometheus.Registerer, backend string) *Metrics {
	// From 100µs (an uncontended local lock) to ~6s (a long queue).
	buckets := prometheus.ExponentialBuckets(0.0001, 3, 11)
	m := &Metrics{
		backend: backend,
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shop_lock_wait_seconds",
			Help:    "Time from asking for a lock to holding it (successful acquisitions).",
			Buckets: buckets,
		}, []string{"backend", "class"}),
		hold: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shop_lock_hold_seconds",
			Help:    "Time from holding a lock to releasing it.",
			Buckets: buckets,
		}, []string{"backend", "class"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_lock_acquire_failures_total",
			Help: "Acquisitions that did not get the lock, by reason: busy (wait timeout), unavailable, cancelled, error.",
		}, []string{"backend", "class", "reason"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_lock_lost_total",
			Help: "Leases that ended before their holder released them (expired, taken away, renewal failed).",
		}, []string{"backend", "class"}),
		fenced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_fenced_writes_total",
			Help: "Writes a store refused because their fencing token was stale.",
		}, []string{"backend", "class"}),
	}
	reg.MustRegister(m.wait, m.hold, m.failures, m.lost, m.fenced)
	return m
}

// Fenced counts one write of class refused by a fence.
func (m *Metrics) Fenced(class lockkey.Class) {
	if m == nil {
		return
	}
	m.fenced.WithLabelValues(m.backend, label(class)).Inc()
}

// A nil *Metrics counts nothing.

func (m *Metrics) failed(class, reason string) {
	if m != nil {
		m.failures.WithLabelValues(m.backend, metricClass(class), reason).Inc()
	}
}

func (m *Metrics) waited(class string, d time.Duration) {
	if m != nil {
		m.wait.WithLabelValues(m.backend, metricClass(class)).Observe(d.Seconds())
	}
}

func (m *Metrics) held(class string, d time.Duration, lost bool) {
	if m == nil {
		return
	}
	if lost {
		m.lost.WithLabelValues(m.backend, metricClass(class)).Inc()
	}
	m.hold.WithLabelValues(m.backend, metricClass(class)).Observe(d.Seconds())
}

// admission turns lock waiters away instead of queueing them past what a
// hot key can serve.
//
// A lock serializes one key: past the rate its critical section allows,
// every extra buyer only lengthens the queue, and everyone's wait grows
// until the whole queue times out together. admission bounds, per key and
// per process, the number of requests waiting, and refuses at once a
// request whose expected wait (the waiters ahead of it in this process
// times the recent time a holder keeps the key) already exceeds its wait
// timeout; the wait timeout bounds the rest. Refusals are
// lockkit.ErrNotAcquired, which shop answers with 503 lock-busy and
// Retry-After; the buyers who are admitted keep a wait near one queue's
// length.
//
// The estimate counts only this process's waiters, so with several
// processes it is low, never high: it refuses early only what the wait
// timeout would refuse late, and never a request that would have been
// served in time.
type admission struct {
	max  int // waiters per key; 0: no bound
	mu   sync.Mutex
	keys map[string]*queue
}

// The estimate of a hold is the median of the key's last recentHolds
// holds, made once minHolds have been seen: one slow hold (a cold
// database's first query) moves it not at all, a load change within a few
// grants. A mean would carry the slow one for dozens of grants and turn
// away queues that would have been served in time.
const (
	recentHolds = 8
	minHolds    = 3
)

// queue is one key's traffic in this process.
type queue struct {
	waiting, holding int
	// recent are the last holds of the key here, seen counts them all:
	// what each waiter ahead of a newcomer costs it.
	recent   [recentHolds]time.Duration
	seen     int
	lastUsed time.Time
}

// hold is the median of the recent holds, 0 until minHolds were seen.
func (q *queue) hold() time.Duration {
	if q.seen < minHolds {
		return 0
	}
	holds := q.recent
	n := min(q.seen, recentHolds)
	slices.Sort(holds[:n])
	return holds[n/2]
}

func newAdmission(maxWaiters int) *admission {
	return &admission{max: maxWaiters, keys: map[string]*queue{}}
}

// enter queues a waiter for key, or refuses it when the queue is full or
// its expected wait outlasts waitTimeout (0: no estimate is used). The
// admitted waiter calls leave once its wait ended.
func (a *admission) enter(key string, waitTimeout time.Duration) (*queue, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	q := a.keys[key]
	if q == nil {
		a.sweep()
		q = &queue{}
		a.keys[key] = q
	}
	if a.max > 0 && q.waiting >= a.max {
		return nil, fmt.Errorf("%w: %d requests of this instance already wait for %s", lockkit.ErrNotAcquired, q.waiting, key)
	}
	if waitTimeout > 0 && q.waiting > 0 {
		if expected := time.Duration(q.waiting) * q.hold(); expected > waitTimeout {
			return nil, fmt.Errorf("%w: the wait for %s is expected to take %s, more than the %s allowed",
				lockkit.ErrNotAcquired, key, expected.Round(time.Millisecond), waitTimeout)
		}
	}
	q.waiting++
	return q, nil
}

// leave ends q's wait: granted, the waiter now holds the key.
func (a *admission) leave(q *queue, granted bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	q.waiting--
	if granted {
		q.holding++
	}
}

// released ends a hold of q that began at granted, and learns its length.
func (a *admission) released(q *queue, granted time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	q.holding--
	now := time.Now()
	q.recent[q.seen%recentHolds] = now.Sub(granted)
	q.seen++
	q.lastUsed = now
}

// Keys idle for idleAfter are dropped once the map holds sweepAbove of
// them: an idle key's estimate is stale anyway, and the keys (SKUs,
// accounts) are as many as the clients like.
const (
	sweepAbove = 4096
	idleAfter  = time.Minute
)

func (a *admission) sweep() {
	if len(a.keys) < sweepAbove {
		return
	}
	for key, q := range a.keys {
		if q.waiting == 0 && q.holding == 0 && time.Since(q.lastUsed) > idleAfter {
			delete(a.keys, key)
		}
	}
}
