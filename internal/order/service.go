package order

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
)

// DefaultPayTimeout is how long an order may await payment when Options
// say nothing (SHOP_ORDER_PAY_TIMEOUT's default).
const DefaultPayTimeout = 15 * time.Minute

// Options configure NewService.
type Options struct {
	// Locking guards every change; a nil Locker is lockkit.None(), the
	// unsafe baseline, for the closer's leader lease too.
	guard.Locking
	// PayTimeout is how long an order may await payment before the closer
	// cancels it and returns its stock (default DefaultPayTimeout).
	PayTimeout time.Duration
	// LeaderTTL is the closer's leader lease, renewed by the watchdog while
	// its instance lives (default lockkit.DefaultLeaseTTL). A new leader
	// takes over at most this long after the old one died or stalled.
	LeaderTTL time.Duration
	// MaxUnpaidUnits is how many units one user may hold in orders
	// awaiting payment (default DefaultMaxUnpaidUnits).
	MaxUnpaidUnits int64
	// UnpublishedAfter is how long an order event may wait in the outbox
	// before the audit counts it as unpublished (default
	// DefaultUnpublishedAfter).
	UnpublishedAfter time.Duration
}

// Service places, pays, reads and closes orders. It is safe for concurrent
// use.
type Service struct {
	store *Store
	o     Options
	// guard takes the rows' locks; fenced writes refused in any of them
	// count as class order.
	guard *guard.Guard
}

// NewService returns the order service over store.
func NewService(store *Store, o Options) *Service {
	if o.PayTimeout <= 0 {
		o.PayTimeout = DefaultPayTimeout
	}
	if o.MaxUnpaidUnits <= 0 {
		o.MaxUnpaidUnits = DefaultMaxUnpaidUnits
	}
	if o.LeaderTTL <= 0 {
		o.LeaderTTL = lockkit.DefaultLeaseTTL
	}
	if o.UnpublishedAfter <= 0 {
		o.UnpublishedAfter = DefaultUnpublishedAfter
	}
	if o.Locker == nil {
		o.Locker = lockkit.None()
	}
	return &Service{store: store, o: o, guard: guard.New(lockkey.Order, o.Locking)}
}

// Place orders quantity units of sku for user with idempotency key key: the
// order awaiting payment with its stock reserved or, with pay, paid as
// well, in one transaction. It returns the order; or the domain error that
// refused it (inventory.ErrSoldOut, account.ErrInsufficientFunds, ...) with
// nothing changed. Placing again with a key that has an order returns that
// order as it now stands, with existing true, and changes nothing.
func (s *Service) Place(ctx context.Context, user int64, key, sku string, quantity int64, pay bool) (o Order, existing bool, err error) {
	if err := validatePlace(sku, quantity); err != nil {
		return Order{}, false, err
	}
	if found, ok, err := s.store.ByKey(ctx, user, key); err != nil || ok {
		return found, ok, err
	}
	keys, err := s.placeLocks(ctx, user, sku)
	if err != nil {
		return Order{}, false, err
	}
	stock, acct := inventory.Key(sku), account.Key(user)
	o = Order{UserID: user, IdempotencyKey: key, SKU: sku, Quantity: quantity}
	keyed.Result(ctx, &o)
	err = s.guard.Do(ctx, keys, func(ctx context.Context, f guard.Fences) error {
		existing, err = s.store.Create(ctx, &o, Fences{Stock: f.Of(stock), Account: f.Of(acct)}, s.decide(quantity, pay))
		return err
	})
	return o, existing, err
}

func validatePlace(sku string, quantity int64) error {
	if err := inventory.CheckSKU(sku); err != nil {
		return err
	}
	if quantity <= 0 {
		return fmt.Errorf("%w: quantity must be a positive integer, got %d", inventory.ErrInvalidQuantity, quantity)
	}
	return nil
}

// placeLocks returns the keys placing an order locks: the stock's and the
// account's. Unknown SKUs and accounts are turned away before they name a
// lock: a backend keeps a fence counter for every key ever locked. No
// order without an account: one left unpaid holds stock from every other
// buyer, and only an account can pay it.
func (s *Service) placeLocks(ctx context.Context, user int64, sku string) ([]lockkey.Key, error) {
	if _, err := s.store.products.Get(ctx, sku); err != nil {
		return nil, err
	}
	if _, err := s.store.accounts.Get(ctx, user); err != nil {
		return nil, err
	}
	// The account is locked even for a free product or an order left
	// unpaid: paying debits it, at a price read again under the stock's
	// lock; not paying counts the user's unpaid orders (checkUnpaid), one
	// order at a time.
	return []lockkey.Key{inventory.Key(sku), account.Key(user)}, nil
}

// decide is Create's decision for an order of quantity units, paid with
// pay: refused if too large or sold out, else priced and given its status.
func (s *Service) decide(quantity int64, pay bool) func(ctx context.Context, o *Order, p inventory.Product) error {
	return func(ctx context.Context, o *Order, p inventory.Product) error {
		if p.PriceCents > 0 && quantity > math.MaxInt64/p.PriceCents {
			return fmt.Errorf("%w: %d × %d cents", ErrTooLarge, quantity, p.PriceCents)
		}
		if p.Stock < quantity {
			return soldOut(p.Stock, quantity)
		}
		// The price is read under the stock's lock: the order costs what
		// the product cost when its stock was taken.
		o.AmountCents, o.Status, o.CreatedAt = p.PriceCents*quantity, StatusAwaitingPayment, now()
		if pay {
			o.Status, o.PaidAt = StatusPaid, &o.CreatedAt
		} else if err := s.checkUnpaid(ctx, o); err != nil {
			return err
		}
		return guard.Work(ctx, s.o.CriticalSectionDelay)
	}
}

func soldOut(left, asked int64) error {
	if left <= 0 {
		return fmt.Errorf("%w: no units left", inventory.ErrSoldOut)
	}
	return fmt.Errorf("%w: %d left, %d asked", inventory.ErrSoldOut, left, asked)
}

// Pay debits order id of user once. Paying a paid order returns it
// unchanged; paying a cancelled one returns ErrCancelled; a balance below
// the amount returns account.ErrInsufficientFunds and changes nothing.
// The pay deadline is the contract: a pay at or after it returns
// ErrPaymentTooLate and cancels the order as the closer would, whether or
// not the closer has run, so that exactly one of pay and cancel wins.
func (s *Service) Pay(ctx context.Context, user, id int64) (Order, error) {
	o, err := s.Get(ctx, user, id)
	if err != nil {
		return Order{}, err
	}
	if o.Status != StatusAwaitingPayment {
		// Paid: nothing to do, the same order again. Cancelled: refused.
		// Neither needs a lock: both are final.
		return o, o.pay(time.Time{})
	}
	if s.late(o, now()) {
		return s.refuseLate(ctx, o)
	}
	ord, acct := Key(id), account.Key(user)
	keys := []lockkey.Key{ord}
	if o.AmountCents > 0 {
		keys = append(keys, acct)
	}
	err = s.guard.Do(ctx, keys, func(ctx context.Context, f guard.Fences) error {
		o, err = s.store.Update(ctx, id, Fences{Order: f.Of(ord), Account: f.Of(acct)}, func(ctx context.Context, o *Order) error {
			at := now()
			if o.Status == StatusAwaitingPayment && s.late(*o, at) {
				// The deadline passed while this pay waited for its locks.
				return ErrPaymentTooLate
			}
			if err := o.pay(at); err != nil {
				return err
			}
			return guard.Work(ctx, s.o.CriticalSectionDelay)
		})
		return err
	})
	if errors.Is(err, ErrPaymentTooLate) {
		return s.refuseLate(ctx, o)
	}
	return o, err
}

// late reports whether at is at or past o's pay deadline, the instant
// from which the closer may cancel it.
func (s *Service) late(o Order, at time.Time) bool {
	return !at.Before(o.CreatedAt.Add(s.o.PayTimeout))
}

// refuseLate cancels o, past its deadline, as the closer would (under
// its order's and its stock's locks: the stock comes back) and returns
// ErrPaymentTooLate with the order as it now stands.
func (s *Service) refuseLate(ctx context.Context, o Order) (Order, error) {
	if _, err := s.closeOne(ctx, o.ID); err != nil {
		return o, err
	}
	cur, err := s.store.Get(ctx, o.ID)
	if err != nil {
		return o, err
	}
	return cur, fmt.Errorf("%w: order %d had to be paid by %s and was cancelled", ErrPaymentTooLate, o.ID,
		o.CreatedAt.Add(s.o.PayTimeout).Format(time.RFC3339))
}

// closeOne cancels order id if it is still awaiting payment past the pay
// timeout, returning its stock, and reports whether it did.
func (s *Service) closeOne(ctx context.Context, id int64) (bool, error) {
	o, err := s.store.Get(ctx, id)
	if err != nil || o.Status != StatusAwaitingPayment {
		return false, err
	}
	closed := false
	ord, stock := Key(id), inventory.Key(o.SKU)
	err = s.guard.Do(ctx, []lockkey.Key{ord, stock}, func(ctx context.Context, f guard.Fences) error {
		_, err := s.store.Update(ctx, id, Fences{Order: f.Of(ord), Stock: f.Of(stock)}, func(ctx context.Context, o *Order) error {
			if closed = o.cancel(now(), s.o.PayTimeout); !closed {
				return nil
			}
			return guard.Work(ctx, s.o.CriticalSectionDelay)
		})
		return err
	})
	return closed && err == nil, err
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

// List returns up to limit orders of user older than the order before (0:
// from the newest), newest first, and whether more follow.
func (s *Service) List(ctx context.Context, user, before int64, limit int) (orders []Order, more bool, err error) {
	orders, err = s.store.List(ctx, user, before, limit+1)
	if len(orders) > limit {
		return orders[:limit], true, err
	}
	return orders, false, err
}

// stuckAfter is how long an order may await payment before the audit calls
// it stuck: the pay timeout, then a leader lease for a dead leader's
// successor to take over, two closer rounds and a lock wait.
func (s *Service) stuckAfter() time.Duration {
	return s.o.PayTimeout + s.o.LeaderTTL + 2*s.interval() + lockWait
}

// lockWait bounds the wait for a row's lock in the stuck bound.
const lockWait = 10 * time.Second
