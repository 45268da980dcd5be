package instrument

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/lockkey"
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
