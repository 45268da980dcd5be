// Package order places orders: POST /api/v1/orders takes stock from
// inventory, debits the price from the caller's account and records the
// order, all or nothing, behind the Idempotency-Key middleware of package
// idem so that a retry can never place an order twice.
//
// All or nothing is a saga, not one SQL transaction. Stock and balances
// belong to inventory and account, whose read-modify-writes run under their
// own locks (lock:stock:<sku>, lock:account:<id>) with fenced writes; one
// transaction here would have to write their rows behind those locks (a
// lost update against any holder) or reach into their stores. So the order
// calls their services, charge first, then stock, and undoes the charge with
// a refund (account's Deposit, a ledger row like any other) when the stock
// step fails. Charge first because a refund is an operation account already
// offers and the ledger already explains; giving stock back is neither.
//
// The order row is written first, as "pending", under a unique (user,
// idempotency key) index: even if the idempotency layer failed (a Redis
// failover losing the in-flight lock), a second run of the same request
// finds the row and places nothing. A row stays pending only while its
// request runs, or when the process died half-way or a refund failed; those
// are for an operator to reconcile against the ledger (docs/likes-orders.md).
package order

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/lockkit"
)

// Errors of the order domain, mapped to statuses in http.go.
var (
	// ErrNotFound: no order with this id belongs to the caller.
	ErrNotFound = errors.New("order not found")
	// ErrInProgress: an earlier run with the same idempotency key has not
	// finished, or stopped half-way and awaits reconciliation.
	ErrInProgress = errors.New("order in progress")
	// ErrRefundFailed: the stock step failed after the charge, and so did
	// the refund; the order is left for an operator.
	ErrRefundFailed = errors.New("order failed and its refund too")
	// ErrTooLarge: price times quantity exceeds the largest amount.
	ErrTooLarge = errors.New("order amount too large")
)

// Statuses of an order row.
const (
	// StatusPending: the order's request is running, or stopped half-way.
	StatusPending = "pending"
	// StatusPlaced: charged and stock taken.
	StatusPlaced = "placed"
	// StatusRefundFailed: charged, no stock, refund failed.
	StatusRefundFailed = "refund_failed"
)

// Order is one order. Refused orders (sold out, insufficient funds) leave
// no row: their answer is kept by the idempotency layer.
type Order struct {
	ID     int64 `gorm:"primaryKey" json:"id"`
	UserID int64 `gorm:"not null;uniqueIndex:idx_orders_user_key,priority:1" json:"user_id"`
	// IdempotencyKey is the token the order was placed with; unique per
	// user, so that no retry can place a second order.
	IdempotencyKey string `gorm:"size:64;not null;uniqueIndex:idx_orders_user_key,priority:2" json:"-"`
	SKU            string `gorm:"size:64;not null" json:"sku"`
	Quantity       int64  `gorm:"not null" json:"quantity"`
	AmountCents    int64  `gorm:"not null" json:"amount_cents"`
	Status         string `gorm:"size:16;not null;index" json:"status"`
	// PurchaseID is inventory's purchase row, once stock was taken.
	PurchaseID int64     `gorm:"not null;default:0" json:"purchase_id,omitempty"`
	CreatedAt  time.Time `json:"created_at"`
	UpdatedAt  time.Time `json:"-"`
}

// Stock is what an order needs from inventory (inventory.Service has it).
type Stock interface {
	Get(ctx context.Context, sku string) (inventory.Product, error)
	Purchase(ctx context.Context, user int64, sku string, quantity int64) (inventory.Purchase, error)
}

// Wallet is what an order needs from account (account.Service has it).
type Wallet interface {
	Withdraw(ctx context.Context, id, amount int64) (account.Account, error)
	Deposit(ctx context.Context, id, amount int64) (account.Account, error)
}

// refundTimeout bounds the refund, which runs detached from the request:
// a client that left must still get its money back.
const refundTimeout = 15 * time.Second

// Service places and reads orders. It is safe for concurrent use.
type Service struct {
	store  *Store
	stock  Stock
	wallet Wallet
}

// NewService returns an order service over the three stores.
func NewService(store *Store, stock Stock, wallet Wallet) *Service {
	return &Service{store: store, stock: stock, wallet: wallet}
}

// Place orders quantity units of sku for user with idempotency key key. It
// returns the placed order; or the domain error of the step that refused it
// (inventory.ErrSoldOut, account.ErrInsufficientFunds, ...) with nothing
// changed; or ErrInProgress if key already has a pending order. Placing
// again with a key whose order was placed returns that order, unchanged.
func (s *Service) Place(ctx context.Context, user int64, key, sku string, quantity int64) (Order, error) {
	if !inventory.ValidSKU(sku) {
		return Order{}, fmt.Errorf("%w: no product %q", inventory.ErrNotFound, sku)
	}
	if quantity <= 0 {
		return Order{}, fmt.Errorf("%w: quantity must be a positive integer, got %d", inventory.ErrInvalidQuantity, quantity)
	}
	p, err := s.stock.Get(ctx, sku)
	if err != nil {
		return Order{}, err
	}
	if p.PriceCents > 0 && quantity > math.MaxInt64/p.PriceCents {
		return Order{}, fmt.Errorf("%w: %d × %d cents", ErrTooLarge, quantity, p.PriceCents)
	}
	o := Order{UserID: user, IdempotencyKey: key, SKU: sku, Quantity: quantity,
		AmountCents: p.PriceCents * quantity, Status: StatusPending}
	existing, err := s.store.CreatePending(ctx, &o)
	if err != nil {
		return Order{}, err
	}
	if existing != nil {
		switch existing.Status {
		case StatusPlaced:
			return *existing, nil
		case StatusRefundFailed:
			return *existing, fmt.Errorf("%w: order %d", ErrRefundFailed, existing.ID)
		}
		return *existing, fmt.Errorf("%w: order %d was started with this key and has not finished", ErrInProgress, existing.ID)
	}

	if _, err := s.wallet.Withdraw(ctx, user, o.AmountCents); err != nil {
		if settled(err) {
			s.forget(ctx, o)
		} // else the charge may have committed: the row stays pending
		return o, err
	}
	purchase, err := s.stock.Purchase(ctx, user, sku, quantity)
	if err != nil {
		return o, s.refund(ctx, o, err)
	}
	o.Status, o.PurchaseID = StatusPlaced, purchase.ID
	if err := s.store.SetStatus(ctx, o.ID, StatusPlaced, purchase.ID); err != nil {
		// Charged and stock taken, but not recorded: the row stays
		// pending, and a retry answers ErrInProgress until reconciled.
		return o, fmt.Errorf("order %d: record placed: %w", o.ID, err)
	}
	return o, nil
}

// refund gives the charge back after the stock step failed with cause, and
// forgets the order; it returns cause, or ErrRefundFailed.
func (s *Service) refund(ctx context.Context, o Order, cause error) error {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refundTimeout)
	defer cancel()
	if _, err := s.wallet.Deposit(rctx, o.UserID, o.AmountCents); err != nil {
		slog.ErrorContext(rctx, "order: refund failed; reconcile by hand", "order", o.ID, "user", o.UserID,
			"amount_cents", o.AmountCents, "cause", cause, "err", err)
		if serr := s.store.SetStatus(rctx, o.ID, StatusRefundFailed, 0); serr != nil {
			slog.ErrorContext(rctx, "order: record refund failure", "order", o.ID, "err", serr)
		}
		return fmt.Errorf("%w: order %d: %w", ErrRefundFailed, o.ID, err)
	}
	s.forget(rctx, o)
	return cause
}

// forget deletes a pending order whose every step was refused or undone:
// the key may then run again (after a 5xx) and place it.
func (s *Service) forget(ctx context.Context, o Order) {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), refundTimeout)
	defer cancel()
	if err := s.store.Delete(dctx, o.ID); err != nil {
		// Harmless for money and stock; the key answers ErrInProgress.
		slog.WarnContext(dctx, "order: forget refused order", "order", o.ID, "err", err)
	}
}

// settled reports whether a failed step surely changed nothing: a refusal
// by the domain, or a lock failure that happens before any write (account
// writes only under a valid lease, and finishes a write once begun).
// Anything else (a database error at commit) may have committed.
func settled(err error) bool {
	for _, target := range []error{
		account.ErrInsufficientFunds, account.ErrNotFound, account.ErrInvalidAmount, account.ErrOverflow,
		lockkit.ErrNotAcquired, lockkit.ErrLeaseLost, lockkit.ErrFenced, lockkit.ErrUnavailable, lockkit.ErrClosed,
		context.Canceled, context.DeadlineExceeded,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

// Get returns order id if it belongs to user; otherwise ErrNotFound, the
// same for another user's order as for none, so ids reveal nothing.
func (s *Service) Get(ctx context.Context, user, id int64) (Order, error) {
	o, err := s.store.Get(ctx, id)
	if err != nil {
		return Order{}, err
	}
	if o.UserID != user {
		return Order{}, fmt.Errorf("%w: no order %d", ErrNotFound, id)
	}
	return o, nil
}
