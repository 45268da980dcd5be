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
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, append([]string{"consumer"}, labels...))
		reg.MustRegister(v)
		return v
	}
	return &ConsumerMetrics{
		consumedTotal: counter("shop_consumer_messages_total", "Deliveries the consumer handled, redeliveries included."),
		appliedTotal:  counter("shop_consumer_applied_total", "Events whose effect the consumer committed."),
		duplicatesTotal: counter("shop_consumer_duplicates_total",
			"Deliveries of an event already applied, acked without an effect (inbox or lock dedup)."),
		redeliveriesTotal: counter("shop_consumer_redeliveries_total",
			"Deliveries after the first of the same message (ack timed out, nak, or consumer restarted)."),
		fencedTotal: counter("shop_consumer_fenced_total",
			"Lock dedup: a stale lock holder's effect refused by the fenced mark."),
		deadLettersTotal: counter("shop_consumer_dead_letters_total",
			"Messages dead-lettered, by reason: recorded in event_dead_letters and never delivered again.", "reason"),
	}
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
