package events

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the relay's and the outbox's collectors. A nil *Metrics
// counts nothing.
type Metrics struct {
	publishes *prometheus.CounterVec
	errors    prometheus.Counter
}

// scrapeTimeout bounds the backlog query a scrape runs.
const scrapeTimeout = time.Second

// NewMetrics registers on reg:
//   - shop_events_backlog: outbox rows not yet published (database-wide,
//     so every instance reports the same figure);
//   - shop_events_backlog_oldest_age_seconds: age of the oldest of them,
//     0 when there is none;
//   - shop_events_published_total{result="stored|duplicate"}: events the
//     broker acknowledged, "duplicate" being a republish its
//     deduplication absorbed;
//   - shop_events_publish_errors_total: events whose publish failed
//     (timed out, refused, broker unreachable), each retried later;
//   - shop_events_broker_connected: 1 while connected to the broker
//     (connected may be nil: the metric is then left out).
func NewMetrics(reg prometheus.Registerer, outbox *Outbox, connected func() bool) *Metrics {
	m := &Metrics{
		publishes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_events_published_total",
			Help: "Order events the broker acknowledged; result=duplicate counts republishes its Nats-Msg-Id deduplication absorbed.",
		}, []string{"result"}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "shop_events_publish_errors_total",
			Help: "Order events whose publish failed (no ack, refused, broker unreachable); each is retried.",
		}),
	}
	backlog := func() Backlog {
		ctx, cancel := context.WithTimeout(context.Background(), scrapeTimeout)
		defer cancel()
		b, err := outbox.Backlog(ctx)
		if err != nil {
			return Backlog{Rows: -1}
		}
		return b
	}
	reg.MustRegister(m.publishes, m.errors,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shop_events_backlog",
			Help: "Outbox rows not yet published to the broker (-1: the database did not answer).",
		}, func() float64 { return float64(backlog().Rows) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shop_events_backlog_oldest_age_seconds",
			Help: "Age of the oldest outbox row not yet published; 0 when the backlog is empty.",
		}, func() float64 {
			b := backlog()
			if b.Rows <= 0 {
				return 0
			}
			return time.Since(b.Oldest).Seconds()
		}))
	m.publishes.WithLabelValues("stored")
	m.publishes.WithLabelValues("duplicate")
	if connected != nil {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shop_events_broker_connected",
			Help: "1 while this instance is connected to the NATS broker, else 0.",
		}, func() float64 {
			if connected() {
				return 1
			}
			return 0
		}))
	}
	return m
}

func (m *Metrics) published(duplicate bool) {
	if m == nil {
		return
	}
	if duplicate {
		m.publishes.WithLabelValues("duplicate").Inc()
		return
	}
	m.publishes.WithLabelValues("stored").Inc()
}

func (m *Metrics) publishFailed() {
	if m != nil {
		m.errors.Inc()
	}
}
