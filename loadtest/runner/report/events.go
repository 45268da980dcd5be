package report

import (
	"fmt"
	"strconv"
	"strings"
)

// The ways events leave shop and are applied (SHOP_EVENTS_DELIVERY,
// SHOP_EVENTS_DEDUP), as an events row names them.
const (
	DeliveryOutbox = "outbox"
	DeliveryDirect = "direct"
	DedupInbox     = "inbox"
	DedupLock      = "lock"
	DedupNone      = "none"
)

// Events is what an events row measured once the run drained: the order
// events written and those the broker got, the consumer's effects against
// the paid orders, how long an effect followed its commit, and the faults
// made while the orders flowed.
type Events struct {
	// Written: outbox rows, one per order change. Lost: those whose event
	// id never reached the stream.
	Written int64 `json:"written"`
	Lost    int64 `json:"lost"`
	// Paid orders; Doubled: credits beyond the first for one order;
	// Missing: paid orders whose event reached the stream and earned no
	// credit (a consumer that dropped a delivery).
	Paid    int64 `json:"paid"`
	Doubled int64 `json:"doubled"`
	Missing int64 `json:"missing"`
	// Redelivered: deliveries beyond the first of a message (JetStream's
	// consumer sequence past its stream sequence). Republished: publishes
	// the broker acknowledged as duplicates of an id it had.
	Redelivered int64 `json:"redelivered"`
	Republished int64 `json:"republished"`
	// Lag is from the paid event's outbox row (written in the payment's
	// transaction) to its first credit, over the credited orders.
	Lag Latency `json:"lag"`
	// Faults are what the runner did to the processes, in order.
	Faults []string `json:"faults"`
	// DrainSeconds: from the end of k6 until the outbox and the consumer
	// had nothing left.
	DrainSeconds float64 `json:"drain_seconds"`
}

// IsEvents reports whether the row is about events: its delivery and
// dedup are set, and the events table shows it.
func (r Row) IsEvents() bool { return r.Delivery != "" }

// eventsDamage is what the events columns count as damage: events lost
// and effects doubled.
func (r Result) eventsDamage() int64 {
	if r.Events == nil {
		return 0
	}
	return r.Events.Lost + r.Events.Doubled
}

// eventsNotAsPromised: every events row must lose no event unless it
// delivers directly, double no effect unless it has no dedup, and apply
// every event that reached the consumer; the unsafe ways must show their
// damage, and the faults must have caused a redelivery and (through the
// relay) a republish, or the row tested nothing.
func eventsNotAsPromised(r Result) []string {
	if !r.Spec.IsEvents() {
		return nil
	}
	e := r.Events
	if e == nil {
		return []string{"no events measured"}
	}
	var out []string
	direct, noDedup := r.Spec.Delivery == DeliveryDirect, r.Spec.Dedup == DedupNone
	switch {
	case e.Lost > 0 && !direct:
		out = append(out, fmt.Sprintf("%d events lost: the %s loses none", e.Lost, r.Spec.Delivery))
	case e.Lost == 0 && direct:
		out = append(out, "no event lost: no publish fell in the broker's restart")
	}
	switch {
	case e.Doubled > 0 && !noDedup:
		out = append(out, fmt.Sprintf("%d effects doubled: the %s dedup applies each event once", e.Doubled, r.Spec.Dedup))
	case e.Doubled == 0 && noDedup:
		out = append(out, fmt.Sprintf("no effect doubled (%d redeliveries): no redelivery followed an applied delivery", e.Redelivered))
	}
	if e.Missing > 0 {
		out = append(out, fmt.Sprintf("%d paid orders whose event reached the stream were never credited", e.Missing))
	}
	if e.Redelivered == 0 {
		out = append(out, "no redelivery happened: the consumer faults tested nothing")
	}
	if e.Republished == 0 && !direct {
		out = append(out, "no event republished: the relay leader's kill tested nothing")
	}
	if e.Paid == 0 {
		out = append(out, "no order paid: the row measured nothing")
	}
	return out
}

// EventColumns are the events table's columns.
var EventColumns = []string{"row", "delivery", "dedup", "paid orders", "events", "redelivered", "republished",
	"events lost", "effects doubled", "lag p50", "lag p99"}

// firstEventDamageColumn is the index in EventColumns of events lost,
// followed by effects doubled.
const firstEventDamageColumn = 7

// EventCells are an events row's cells under EventColumns.
func (r Result) EventCells() []string {
	cells := []string{r.Spec.Name, r.Spec.Delivery, r.Spec.Dedup}
	e := r.Events
	if e == nil {
		return append(cells, make([]string, len(EventColumns)-len(cells))...)
	}
	n := func(v int64) string { return strconv.FormatInt(v, 10) }
	return append(cells, n(e.Paid), n(e.Written), n(e.Redelivered), n(e.Republished), n(e.Lost), n(e.Doubled),
		ms(e.Lag.P50), ms(e.Lag.P99))
}

// eventResults are the events rows of the report.
func (r Report) eventResults() []Result {
	var out []Result
	for _, res := range r.Results {
		if res.Spec.IsEvents() {
			out = append(out, res)
		}
	}
	return out
}

// eventsLegend says what the events table's columns are.
const eventsLegend = "Each events row runs the orders flow alone on the instances, a nats-server of the runner's own and two " +
	"`shop consume` processes, and meanwhile stops a consumer inside a paid event's effect past its ack wait (then lets it " +
	"go on), restarts the broker, SIGKILLs the relay's leader between the broker's ack and its mark, and SIGKILLs the other " +
	"consumer (each killed process is restarted); then waits until the outbox and the consumer are drained " +
	"(docs/loadtest.md). **events lost**: outbox rows (one per order change) whose event id never reached the stream. **effects doubled**: loyalty credits beyond the first for one order. **lag**: from the paid event's " +
	"outbox row (written in the payment's transaction) to its first credit. **redelivered**: deliveries beyond a " +
	"message's first; **republished**: publishes the broker absorbed as duplicates."

// eventsMarkdown is the events section of the Markdown report, empty
// when no events row ran.
func (r Report) eventsMarkdown() string {
	results := r.eventResults()
	if len(results) == 0 {
		return ""
	}
	var rows [][]string
	for _, res := range results {
		faults := "—"
		if res.Events != nil {
			faults = strings.Join(res.Events.Faults, "; ")
		}
		rows = append(rows, append(res.EventCells(), faults, res.Verdict))
	}
	return "\n## Events\n\n" + mdTable(append(append([]string{}, EventColumns...), "faults", "verdict"), rows) +
		"\n" + eventsLegend + "\n"
}
