package events

import (
	"context"
	"time"
)

// Direct is the dual write, kept to show its damage: each event is
// published by the request that made the change, right after its
// transaction committed, once. A process that dies between the commit and
// the publish, or a broker that does not answer then, loses the event:
// nothing publishes it later. The outbox row is still written in the
// change's transaction, as the record the audit counts the losses from,
// and marked when the publish was acknowledged; no relay reads it.
type Direct struct{ r *Relay }

// NewDirect returns direct delivery over o (Locker and the relay's timing
// are not used).
func NewDirect(o RelayOptions) *Direct { return &Direct{r: NewRelay(o)} }

// Publish publishes the events ids, which the caller's transaction has
// just committed, and marks those the broker acknowledged. It returns
// nothing: a lost event is the point, and it is logged and counted.
func (d *Direct) Publish(ctx context.Context, ids ...string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.r.o.PublishTimeout)
	defer cancel()
	rows := make([]OutboxRow, 0, len(ids))
	for _, id := range ids {
		row, err := d.r.o.Outbox.Row(ctx, id)
		if err != nil {
			d.r.o.Log.Warn("direct delivery: event lost", "event", id, "err", err)
			continue
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		return
	}
	if err := d.r.ensureStream(ctx); err != nil {
		d.r.o.Log.Warn("direct delivery: events lost", "events", ids, "err", err)
		return
	}
	acked, err := d.r.publish(ctx, rows)
	if err != nil {
		d.r.o.Log.Warn("direct delivery: events lost", "events", ids, "err", err)
	}
	// The mark only keeps the audit's record; unfenced, as no lease is
	// involved.
	mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer mcancel()
	if err := d.r.o.Outbox.MarkPublished(mctx, 0, acked); err != nil {
		d.r.o.Log.Warn("direct delivery: mark", "events", ids, "err", err)
	}
}
