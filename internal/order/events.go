package order

import (
	"context"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/events"
)

// newEventTypes are the events of placing o: placed and, paid at once,
// paid.
func newEventTypes(o Order) []string {
	if o.Status == StatusPaid {
		return []string{events.TypeOrderPlaced, events.TypeOrderPaid}
	}
	return []string{events.TypeOrderPlaced}
}

// statusEventType is the event of an order reaching status.
func statusEventType(status string) string {
	if status == StatusPaid {
		return events.TypeOrderPaid
	}
	return events.TypeOrderCancelled
}

// eventOf is the event of type typ of o as it now stands.
func eventOf(o Order, typ string) events.Event {
	at := o.CreatedAt
	switch {
	case typ == events.TypeOrderPaid && o.PaidAt != nil:
		at = *o.PaidAt
	case typ == events.TypeOrderCancelled && o.CancelledAt != nil:
		at = *o.CancelledAt
	}
	return events.Event{ID: events.ID(o.ID, typ), Type: typ, OrderID: o.ID, UserID: o.UserID, SKU: o.SKU,
		Quantity: o.Quantity, AmountCents: o.AmountCents, OccurredAt: at}
}

// DefaultUnpublishedAfter is how long an order event may wait in the
// outbox before the audit counts it as unpublished, when Options say
// nothing: well past a relay's retry span, so that a backlog draining
// normally counts nothing.
const DefaultUnpublishedAfter = time.Minute

// UnpublishedEvents is the events audit: for each event type, the events
// the orders' statuses say happened (placed for every order, paid or
// cancelled for those in that status) that the outbox has not published,
// leaving out those written after before (still in flight). An event with
// no outbox row at all counts too. It reads the orders and the outbox in
// one transaction.
func (s *Store) UnpublishedEvents(ctx context.Context, before time.Time) (map[string]int64, error) {
	var orders []Order
	var rows []events.OutboxRow
	err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Select("id", "status").Find(&orders).Error; err != nil {
			return err
		}
		return tx.Select("order_id", "type", "created_at", "published_at").Find(&rows).Error
	})
	if err != nil {
		return nil, err
	}
	type event struct {
		order int64
		typ   string
	}
	delivered := make(map[event]bool, len(rows))
	for _, r := range rows {
		if r.PublishedAt != nil || r.CreatedAt.After(before) {
			delivered[event{r.OrderID, r.Type}] = true
		}
	}
	out := map[string]int64{}
	for _, o := range orders {
		want := []string{events.TypeOrderPlaced}
		if o.Status == StatusPaid || o.Status == StatusCancelled {
			want = append(want, statusEventType(o.Status))
		}
		for _, t := range want {
			if !delivered[event{o.ID, t}] {
				out[t]++
			}
		}
	}
	return out, nil
}
