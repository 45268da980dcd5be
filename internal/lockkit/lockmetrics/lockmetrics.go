// Package lockmetrics is a lockkit.Locker decorator that records Prometheus
// metrics: how long acquisitions wait, how long leases are held, how many
// leases are lost behind their holder's back, and (reported by the stores)
// how many writes a fence refused.
//
// The leases it hands out must be released (lockkit.Do always does): a
// lease's hold time and its loss are recorded when it is released.
//
// Metrics are labelled by backend and by key class (stock, account, like,
// order; the leader lease, and a key taken without a class, is "other"),
// never by the key itself: one series per SKU or account would grow
// without bound. The class is given, never read back out of the key: each
// acquisition names it with lockkit.WithClass (package guard does, from
// each key's class).
package lockmetrics

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
)

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

// Metrics holds the collectors of one backend. Create it once per process.
type Metrics struct {
	backend  string
	wait     *prometheus.HistogramVec
	hold     *prometheus.HistogramVec
	failures *prometheus.CounterVec
	lost     *prometheus.CounterVec
	fenced   *prometheus.CounterVec
}

// New registers the lock metrics with reg, labelled with backend. It panics
// if they are already registered there, as prometheus.MustRegister does.
func New(reg prometheus.Registerer, backend string) *Metrics {
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
	m.fenced.WithLabelValues(m.backend, label(class)).Inc()
}

// Wrap returns l with its acquisitions and leases measured, each labelled
// by the class its acquisition names (lockkit.WithClass).
func (m *Metrics) Wrap(l lockkit.Locker) lockkit.Locker {
	return &locker{m: m, inner: l}
}

type locker struct {
	m     *Metrics
	inner lockkit.Locker
}

func (l *locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return l.measure(ctx, key, opts, l.inner.Acquire)
}

func (l *locker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return l.measure(ctx, key, opts, l.inner.TryAcquire)
}

func (l *locker) measure(ctx context.Context, key string, opts []lockkit.Option,
	grant func(context.Context, string, ...lockkit.Option) (lockkit.Lease, error)) (lockkit.Lease, error) {
	class := label(lockkey.Class(lockkit.ClassOf(opts)))
	start := time.Now()
	inner, err := grant(ctx, key, opts...)
	if err != nil {
		l.m.failures.WithLabelValues(l.m.backend, class, reason(err)).Inc()
		return nil, err
	}
	held := time.Now()
	l.m.wait.WithLabelValues(l.m.backend, class).Observe(held.Sub(start).Seconds())
	return &lease{Lease: inner, m: l.m, class: class, held: held}, nil
}

func reason(err error) string {
	switch {
	case errors.Is(err, lockkit.ErrNotAcquired):
		return "busy"
	case errors.Is(err, lockkit.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "cancelled"
	}
	return "error"
}

func (l *locker) Close() error { return l.inner.Close() }

// Capabilities reports the inner Locker's.
func (l *locker) Capabilities() lockkit.Capabilities {
	return lockkit.CapabilitiesOf(l.inner)
}

// Unwrap returns the measured Locker.
func (l *locker) Unwrap() lockkit.Locker { return l.inner }

type lease struct {
	lockkit.Lease
	m     *Metrics
	class string
	held  time.Time
	once  sync.Once
}

// Release records the hold time, and counts the lease as lost if Lost had
// closed before its holder let go. Looking at release time rather than
// watching Lost costs no goroutine per lease; lockkit.Do always releases.
func (l *lease) Release(ctx context.Context) error {
	l.once.Do(func() {
		select {
		case <-l.Lease.Lost():
			l.m.lost.WithLabelValues(l.m.backend, l.class).Inc()
		default:
		}
		l.m.hold.WithLabelValues(l.m.backend, l.class).Observe(time.Since(l.held).Seconds())
	})
	return l.Lease.Release(ctx)
}
