package events

import "github.com/prometheus/client_golang/prometheus"

// ConsumerMetrics count what consumers do with deliveries, labelled by
// consumer (and by reason for dead letters: a fixed, short list).
type ConsumerMetrics struct {
	consumedTotal, appliedTotal, duplicatesTotal, redeliveriesTotal, fencedTotal *prometheus.CounterVec
	deadLettersTotal                                                             *prometheus.CounterVec
}

// NewConsumerMetrics registers the consumer metrics on reg.
func NewConsumerMetrics(reg prometheus.Registerer) *ConsumerMetrics {
	m := &ConsumerMetrics{
		consumedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shop_consumer_messages_total",
			Help: "Deliveries the consumer handled, redeliveries included."}, []string{"consumer"}),
		appliedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shop_consumer_applied_total",
			Help: "Events whose effect the consumer committed."}, []string{"consumer"}),
		duplicatesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shop_consumer_duplicates_total",
			Help: "Deliveries of an event already applied, acked without an effect (inbox or lock dedup)."}, []string{"consumer"}),
		redeliveriesTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shop_consumer_redeliveries_total",
			Help: "Deliveries after the first of the same message (ack timed out, nak, or a consumer restarted)."}, []string{"consumer"}),
		fencedTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shop_consumer_fenced_total",
			Help: "Lock dedup: a stale lock holder's effect refused by the fenced mark."}, []string{"consumer"}),
		deadLettersTotal: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "shop_consumer_dead_letters_total",
			Help: "Messages dead-lettered, by reason: recorded in event_dead_letters and never delivered again."},
			[]string{"consumer", "reason"}),
	}
	reg.MustRegister(m.consumedTotal, m.appliedTotal, m.duplicatesTotal, m.redeliveriesTotal, m.fencedTotal, m.deadLettersTotal)
	return m
}

// The methods are no-ops on a nil *ConsumerMetrics, so that tests and
// tools may leave metrics out.

func (m *ConsumerMetrics) consumed(c string) {
	if m != nil {
		m.consumedTotal.WithLabelValues(c).Inc()
	}
}

func (m *ConsumerMetrics) applied(c string) {
	if m != nil {
		m.appliedTotal.WithLabelValues(c).Inc()
	}
}

func (m *ConsumerMetrics) duplicate(c string) {
	if m != nil {
		m.duplicatesTotal.WithLabelValues(c).Inc()
	}
}

func (m *ConsumerMetrics) redelivered(c string) {
	if m != nil {
		m.redeliveriesTotal.WithLabelValues(c).Inc()
	}
}

func (m *ConsumerMetrics) fenced(c string) {
	if m != nil {
		m.fencedTotal.WithLabelValues(c).Inc()
	}
}

func (m *ConsumerMetrics) deadLettered(c, reason string) {
	if m != nil {
		m.deadLettersTotal.WithLabelValues(c, reason).Inc()
	}
}
