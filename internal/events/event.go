// Package events carries order changes out of the service exactly once in
// effect: an outbox row written in the change's own transaction, a relay
// that publishes it to NATS JetStream, and consumers that apply each event
// once however often it is delivered.
package events

import (
	"fmt"
	"time"
)

// Types of an order event. An order is placed once and then paid or
// cancelled once; both are final, so an order has at most two events.
const (
	TypeOrderPlaced    = "order.placed"
	TypeOrderPaid      = "order.paid"
	TypeOrderCancelled = "order.cancelled"
)

// Stream is the JetStream stream every order event is published to, on
// SubjectPrefix + the event's type ("shop.events.order.paid").
const (
	Stream        = "SHOP_EVENTS"
	SubjectPrefix = "shop.events."
	Subjects      = SubjectPrefix + ">"
)

// Event is one order change, as the outbox keeps it and as it travels.
// Its ID is derived from what happened, never minted at publish time, so
// that every retry of the change or of its publish carries the same ID:
// JetStream deduplicates on it (Nats-Msg-Id) and consumers record it.
type Event struct {
	ID          string    `json:"id"`
	Type        string    `json:"type"`
	OrderID     int64     `json:"order_id"`
	UserID      int64     `json:"user_id"`
	SKU         string    `json:"sku"`
	Quantity    int64     `json:"quantity"`
	AmountCents int64     `json:"amount_cents"`
	OccurredAt  time.Time `json:"occurred_at"`
}

// ID is the id of the event of type typ on order orderID: "order:42:order.paid".
func ID(orderID int64, typ string) string { return fmt.Sprintf("order:%d:%s", orderID, typ) }

// Subject is the subject the event is published on.
func (e Event) Subject() string { return SubjectPrefix + e.Type }
