package order

import (
	"context"
	"strconv"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/inventory"
)

// Reconciliation is the order audit: every order against the ledger rows
// and purchase rows that carry its id, each drift keyed by order id. An id
// with rows but no order is an orphan: money or stock moved for nothing.
type Reconciliation struct {
	// UnreconciledCents: per order, the cents its ledger rows moved minus
	// what its status says they should (the amount debited if paid,
	// nothing otherwise: there is no refund, so a cancelled order's debit
	// is money kept for nothing).
	UnreconciledCents map[string]int64
	// UnreconciledUnits: per order, the units it holds (reserved minus
	// returned) minus what its status says (its quantity unless
	// cancelled, then nothing).
	UnreconciledUnits map[string]int64
	// MiscountedRecords: per order, how far its record count is from one
	// reservation, one debit if paid (and not free), one return if
	// cancelled: e.g. a second debit, a reservation missing.
	MiscountedRecords map[string]int64
	// PaidAndCancelled: orders with both a debit and a stock return, the
	// damage of a pay and a close that ran at once.
	PaidAndCancelled map[string]int64
	// StockReturnedTwice: per order, the returns beyond the first.
	StockReturnedTwice map[string]int64
	// Misattributed: per order, how many of these are wrong, each a sum
	// the other members cannot see: a debit from an account that is not
	// the order's user's; a reservation of another SKU than the order's,
	// or spread over several; a return into another SKU or sale than the
	// reservation's (it would give the units to a sale that never sold
	// them, which could then oversell by as many).
	Misattributed map[string]int64
	// Stuck: orders awaiting payment for longer than the bound (the closer
	// is not running or not keeping up), or with a status no version of
	// shop writes now (rows from before the lifecycle; reset them).
	Stuck map[string]int64
}

// Reconcile reads the orders, the order ledger rows and the order purchase
// rows in one transaction, so that a change in flight is seen whole or not
// at all (each change commits its rows together), and compares them. An
// order awaiting payment since before stuckBefore counts as stuck.
func (s *Store) Reconcile(ctx context.Context, stuckBefore time.Time) (Reconciliation, error) {
	r := Reconciliation{
		UnreconciledCents: map[string]int64{}, UnreconciledUnits: map[string]int64{},
		MiscountedRecords: map[string]int64{}, PaidAndCancelled: map[string]int64{},
		StockReturnedTwice: map[string]int64{}, Stuck: map[string]int64{}, Misattributed: map[string]int64{},
	}
	orders, money, units, err := s.orderRecords(ctx)
	if err != nil {
		return r, err
	}
	seen := make(map[int64]bool, len(orders))
	for _, o := range orders {
		seen[o.ID] = true
		r.addOrder(o, money[o.ID], units[o.ID], stuckBefore)
	}
	r.addOrphans(money, units, seen)
	return r, nil
}

// orderRecords reads the orders with the ledger and purchase rows that
// carry their ids, in one transaction.
func (s *Store) orderRecords(ctx context.Context) (orders []Order, money map[int64]account.OrderDebits,
	units map[int64]inventory.OrderUnits, err error) {
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Select("id", "user_id", "sku", "status", "quantity", "amount_cents", "created_at").Find(&orders).Error; err != nil {
			return err
		}
		var err error
		if money, err = account.OrderLedger(tx); err != nil {
			return err
		}
		units, err = inventory.OrderStock(tx)
		return err
	})
	return orders, money, units, err
}

// owed is what an order's status says its rows should have moved.
type owed struct {
	cents, debits int64 // the debit's cents (negative) and rows
	units         int64 // units held: reserved and not returned
	returns       int64 // stock return rows
}

// owedBy is what o's rows should have moved in its status. A status no
// version of shop writes now owes nothing (and is stuck).
func owedBy(o Order) owed {
	switch o.Status {
	case StatusPaid:
		if o.AmountCents > 0 {
			return owed{cents: -o.AmountCents, debits: 1, units: o.Quantity}
		}
		return owed{units: o.Quantity}
	case StatusAwaitingPayment:
		return owed{units: o.Quantity}
	case StatusCancelled:
		return owed{returns: 1}
	}
	return owed{}
}

// stuck reports whether o awaits payment since before stuckBefore or has a
// status no version of shop writes now.
func stuck(o Order, stuckBefore time.Time) bool {
	switch o.Status {
	case StatusPaid, StatusCancelled:
		return false
	case StatusAwaitingPayment:
		return o.CreatedAt.Before(stuckBefore)
	}
	return true
}

// addOrder compares order o with its ledger rows m and purchase rows u.
func (r *Reconciliation) addOrder(o Order, m account.OrderDebits, u inventory.OrderUnits, stuckBefore time.Time) {
	key := strconv.FormatInt(o.ID, 10)
	want := owedBy(o)
	if stuck(o, stuckBefore) {
		r.Stuck[key] = 1
	}
	r.UnreconciledCents[key] = m.Cents - want.cents
	r.UnreconciledUnits[key] = u.Reserved - u.Returned - want.units
	r.MiscountedRecords[key] = abs(m.Rows-want.debits) + abs(u.ReservedRows-1) + abs(u.ReturnedRows-want.returns)
	if m.Rows > 0 && u.ReturnedRows > 0 {
		r.PaidAndCancelled[key] = 1
	}
	if u.ReturnedRows > 1 {
		r.StockReturnedTwice[key] = u.ReturnedRows - 1
	}
	if n := misattributed(o, m, u); n > 0 {
		r.Misattributed[key] = n
	}
}

// addOrphans counts the ledger and purchase rows of ids with no order in
// seen: money or stock moved for nothing.
func (r *Reconciliation) addOrphans(money map[int64]account.OrderDebits, units map[int64]inventory.OrderUnits, seen map[int64]bool) {
	for id, m := range money {
		if !seen[id] {
			key := strconv.FormatInt(id, 10)
			r.UnreconciledCents[key] = m.Cents
			r.MiscountedRecords[key] += m.Rows
		}
	}
	for id, u := range units {
		if !seen[id] {
			key := strconv.FormatInt(id, 10)
			r.UnreconciledUnits[key] = u.Reserved - u.Returned
			r.MiscountedRecords[key] += u.ReservedRows + u.ReturnedRows
		}
	}
}

// misattributed counts what o's rows moved for someone or something else:
// see Reconciliation.Misattributed.
func misattributed(o Order, m account.OrderDebits, u inventory.OrderUnits) int64 {
	var n int64
	if m.Rows > 0 && (m.MinAccount != o.UserID || m.MaxAccount != o.UserID) {
		n++
	}
	res := u.Reservations
	if u.ReservedRows > 0 && (!res.Single() || res.MinSKU != o.SKU) {
		n++
	}
	if u.ReturnedRows > 0 && u.ReservedRows > 0 && u.Returns != res {
		n++
	}
	return n
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// checks are the order invariants for the audit. The load test reads
// these names: do not rename one.
func (s *Store) checks(stuckAfter time.Duration) []audit.Check {
	pick := func(f func(Reconciliation) map[string]int64) func(context.Context) (map[string]int64, error) {
		return func(ctx context.Context) (map[string]int64, error) {
			r, err := s.Reconcile(ctx, time.Now().Add(-stuckAfter))
			return f(r), err
		}
	}
	return []audit.Check{
		{Name: "unreconciled_order_cents", By: "by_order", Unit: "cents", Run: pick(func(r Reconciliation) map[string]int64 { return r.UnreconciledCents })},
		{Name: "unreconciled_order_units", By: "by_order", Unit: "units", Run: pick(func(r Reconciliation) map[string]int64 { return r.UnreconciledUnits })},
		{Name: "miscounted_order_records", By: "by_order", Run: pick(func(r Reconciliation) map[string]int64 { return r.MiscountedRecords })},
		{Name: "paid_and_cancelled_orders", By: "by_order", Run: pick(func(r Reconciliation) map[string]int64 { return r.PaidAndCancelled })},
		{Name: "stock_returned_twice", By: "by_order", Run: pick(func(r Reconciliation) map[string]int64 { return r.StockReturnedTwice })},
		{Name: "stuck_orders", By: "by_order", Run: pick(func(r Reconciliation) map[string]int64 { return r.Stuck })},
		{Name: "misattributed_order_records", By: "by_order", Run: pick(func(r Reconciliation) map[string]int64 { return r.Misattributed })},
	}
}

// eventChecks are the audit's checks of the order events: those never
// published, once the ones younger than unpublishedAfter are left aside.
func (s *Store) eventChecks(unpublishedAfter time.Duration) []audit.Check {
	return []audit.Check{{Name: "unpublished_order_events", By: "by_type",
		Run: func(ctx context.Context) (map[string]int64, error) {
			return s.UnpublishedEvents(ctx, time.Now().UTC().Add(-unpublishedAfter))
		}}}
}
