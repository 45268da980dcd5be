// Package order places, pays and closes orders.
//
// Stock and balances live in the same database as orders, so every change
// of an order is one local transaction, not a saga: there is no refund
// path left to fail. POST /api/v1/orders writes the order row, the stock
// reservation (the decrement and an insert-only purchase row) and, with
// {"pay": true}, the debit (the balance and its ledger row) in one
// transaction, under the locks of the rows it touches (lock:stock:<sku>,
// lock:account:<user>, taken in sorted order). POST .../{id}/pay debits
// once under lock:order:<id> and lock:account:<user>. A closer, run by the
// one instance holding the lease lock:order-closer, cancels orders left
// unpaid past the pay timeout and returns their stock, one order per
// transaction under lock:order:<id> and lock:stock:<sku>.
//
// Every mutable row is claimed with its lock's fencing token before it is
// read and written only while it still carries that token, as account and
// inventory do for their own writes; a transaction whose lease ran out is
// refused whole. Placing is guarded by the Idempotency-Key middleware of
// package idem and, underneath it, by a unique (user, key) index: a second
// run of the same request finds the order and places nothing.
package order

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/lockbench/shop/internal/lockkey"
)

// Errors of the order domain, mapped to statuses in http.go.
var (
	// ErrNotFound: no order with this id belongs to the caller.
	ErrNotFound = errors.New("order not found")
	// ErrCancelled: the order was cancelled (unpaid in time) and cannot be
	// paid.
	ErrCancelled = errors.New("order cancelled")
	// ErrTooLarge: price times quantity exceeds the largest amount.
	ErrTooLarge = errors.New("order amount too large")
	// ErrUnpaidLimit: the order would leave its user holding more units
	// awaiting payment than one user may.
	ErrUnpaidLimit = errors.New("too many units awaiting payment")
	// ErrPaymentTooLate: the pay came at or after the order's pay
	// deadline; the order is cancelled instead, whether or not the closer
	// had run.
	ErrPaymentTooLate = errors.New("payment too late")
)

// Statuses of an order. awaiting_payment is the only one that changes:
// to paid (once) or to cancelled (once); both are final.
const (
	StatusAwaitingPayment = "awaiting_payment"
	StatusPaid            = "paid"
	StatusCancelled       = "cancelled"
)

// Order is one order. Refused orders (sold out, insufficient funds at
// creation) leave no row: their answer is kept by the idempotency layer.
type Order struct {
	ID     int64 `gorm:"primaryKey;index:idx_orders_user_recent,priority:2" json:"id"`
	UserID int64 `gorm:"not null;uniqueIndex:idx_orders_user_key,priority:1;index:idx_orders_user_recent,priority:1" json:"user_id"`
	// IdempotencyKey is the token the order was placed with; unique per
	// user, so that no retry can place a second order.
	IdempotencyKey string `gorm:"size:64;not null;uniqueIndex:idx_orders_user_key,priority:2" json:"-"`
	SKU            string `gorm:"size:64;not null" json:"sku"`
	Quantity       int64  `gorm:"not null" json:"quantity"`
	AmountCents    int64  `gorm:"not null" json:"amount_cents"`
	Status         string `gorm:"size:16;not null;index:idx_orders_status_created,priority:1" json:"status"`
	// Fence is the highest token of lock:order:<id> that claimed the row.
	Fence       uint64     `gorm:"not null;default:0" json:"-"`
	CreatedAt   time.Time  `gorm:"index:idx_orders_status_created,priority:2" json:"created_at"`
	PaidAt      *time.Time `json:"paid_at,omitempty"`
	CancelledAt *time.Time `json:"cancelled_at,omitempty"`
	UpdatedAt   time.Time  `json:"-"`
}

// Key is the lock key of order id: pay and close race on it.
func Key(id int64) lockkey.Key { return lockkey.Order.Key(strconv.FormatInt(id, 10)) }

// now is the time as the database keeps it (milliseconds, UTC), so that an
// order answered from memory and the same order read back are equal: a
// replayed pay must return the same body.
func now() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }

// pay moves an awaiting order to paid. Paying a paid order changes nothing
// and is no error: a retry gets the same order.
func (o *Order) pay(at time.Time) error {
	switch o.Status {
	case StatusPaid:
		return nil
	case StatusCancelled:
		return fmt.Errorf("%w: order %d was not paid within the pay timeout and was cancelled", ErrCancelled, o.ID)
	case StatusAwaitingPayment:
		o.Status, o.PaidAt = StatusPaid, &at
		return nil
	}
	return fmt.Errorf("order %d has status %q, which no version of shop writes", o.ID, o.Status)
}

// cancel moves an order still awaiting payment at its deadline to
// cancelled, and reports whether it did.
func (o *Order) cancel(at time.Time, timeout time.Duration) bool {
	if o.Status != StatusAwaitingPayment || at.Before(o.CreatedAt.Add(timeout)) {
		return false
	}
	o.Status, o.CancelledAt = StatusCancelled, &at
	return true
}
