package order

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/inventory"
)

// leftover is a state a multi-step order flow (a saga) can leave, laid
// down row by row: the order as it stayed, the ledger rows and purchase
// rows its steps committed, with the balance and stock moved to match (so
// the per-row audits, balance_drift and stock_drift, see nothing wrong).
type leftover struct {
	status        string // "" leaves no order row: it was forgotten
	debit, refund bool
	reserved      bool
	age           time.Duration
	wantNonZero   []string
}

const q = 2

func (s *shop) leave(l leftover) int64 {
	s.t.Helper()
	ctx := context.Background()
	db := s.db.WithContext(ctx)
	must := func(err error) {
		if err != nil {
			s.t.Fatal(err)
		}
	}
	o := Order{UserID: user, IdempotencyKey: "old-" + random(), SKU: "widget", Quantity: q, AmountCents: q * price,
		Status: l.status, CreatedAt: time.Now().Add(-l.age).UTC()}
	if l.status == "" {
		o.Status = StatusAwaitingPayment
	}
	must(db.Create(&o).Error)
	if l.debit {
		must(db.Create(&account.LedgerEntry{AccountID: user, Amount: -o.AmountCents, Kind: account.KindOrder, OrderID: o.ID}).Error)
		must(db.Exec("UPDATE accounts SET balance = balance - ? WHERE id = ?", o.AmountCents, user).Error)
	}
	if l.refund {
		must(db.Create(&account.LedgerEntry{AccountID: user, Amount: o.AmountCents, Kind: "deposit", OrderID: o.ID}).Error)
		must(db.Exec("UPDATE accounts SET balance = balance + ? WHERE id = ?", o.AmountCents, user).Error)
	}
	if l.reserved {
		must(db.Create(&inventory.Purchase{SKU: "widget", UserID: user, Quantity: q, Strategy: inventory.StrategyOrder, OrderID: o.ID}).Error)
		must(db.Exec("UPDATE products SET stock = stock - ? WHERE sku = ?", q, "widget").Error)
	}
	if l.status == "" {
		must(db.Delete(&Order{}, o.ID).Error)
	}
	return o.ID
}

// Each state a multi-step order flow can leave: the per-row checks
// (balance, stock, duplicates) call it clean, the order
// reconciliation does not.
func TestAuditCatchesWhatASagaLeaves(t *testing.T) {
	perRow := []string{"balance_drift", "stock_drift", "oversold_units", "duplicate_orders"}
	for _, tc := range []struct {
		name string
		leftover
	}{
		// SIGTERM with a short shutdown timeout: the charge committed, the
		// stock step and the refund died with the database; the order
		// stayed pending.
		{"shutdown-charged-no-stock", leftover{status: "pending", debit: true,
			wantNonZero: []string{"unreconciled_order_cents", "miscounted_order_records", "stuck_orders"}}},
		// The same, as the new statuses would spell it: awaiting payment,
		// yet charged.
		{"charged-while-awaiting", leftover{status: StatusAwaitingPayment, debit: true, reserved: true,
			wantNonZero: []string{"unreconciled_order_cents", "miscounted_order_records"}}},
		// A client hang-up while the stock write committed: charged and
		// fulfilled, the row never left pending.
		{"hangup-paid-but-pending", leftover{status: "pending", debit: true, reserved: true,
			wantNonZero: []string{"stuck_orders", "unreconciled_order_cents"}}},
		// An ambiguous stock-step error: the stock committed, the order
		// was refunded and forgotten; the retry sold the units again.
		{"ambiguous-error-refunded-and-forgotten", leftover{debit: true, refund: true, reserved: true,
			wantNonZero: []string{"unreconciled_order_units", "miscounted_order_records"}}},
		// A refund tried once and failed: money held, no stock, no order.
		{"refund-failed-money-held", leftover{status: "refund_failed", debit: true,
			wantNonZero: []string{"stuck_orders", "unreconciled_order_cents"}}},
		// An order awaiting payment long past any closer's bound.
		{"never-closed", leftover{status: StatusAwaitingPayment, reserved: true, age: 24 * time.Hour,
			wantNonZero: []string{"stuck_orders"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newShop(t, Options{PayTimeout: time.Minute})
			s.auditOK()
			id := s.leave(tc.leftover)
			r := s.audit()
			b, _ := json.Marshal(r)
			for _, name := range perRow {
				if r.Drifts[name].Total != 0 {
					t.Fatalf("the per-row checks already saw it (%s): %s", name, b)
				}
			}
			if r.OK {
				t.Fatalf("order %d: the audit says ok: %s", id, b)
			}
			for _, name := range tc.wantNonZero {
				if r.Drifts[name].Total == 0 {
					t.Errorf("order %d: %s is 0: %s", id, name, b)
				}
			}
		})
	}
}

// Each state below is laid down by hand, with the balance or stock moved
// to match, so that every per-row check and every per-order sum sees
// nothing wrong. No code path is known to write them; the audit must
// still see who and what an order's rows moved, not only which order.
func TestAuditChecksWhoAndWhatAnOrderMoved(t *testing.T) {
	for _, tc := range []struct {
		name string
		lay  func(s *shop, o Order) error
	}{
		// A paid order whose debit came out of another user's account.
		{"debit-from-another-account", func(s *shop, o Order) error {
			return s.move(o, user+1, "widget")
		}},
		// A reservation taken from another SKU than the order's.
		{"reservation-of-another-sku", func(s *shop, o Order) error {
			return s.move(o, user, "sticker")
		}},
		// An old sale's reservation returned into the new sale: the new
		// sale could then oversell by those units with oversold_units 0.
		{"return-into-another-sale", func(s *shop, o Order) error {
			if err := s.move(o, user, "widget"); err != nil {
				return err
			}
			_, err := s.products.Put(context.Background(), inventory.Product{SKU: "widget", Name: "Widget", Stock: stock, PriceCents: price})
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newShop(t, Options{PayTimeout: time.Minute})
			s.auditOK()
			o := Order{UserID: user, IdempotencyKey: "hand-" + random(), SKU: "widget", Quantity: q, AmountCents: q * price,
				Status: StatusPaid, CreatedAt: time.Now().UTC()}
			if tc.name == "return-into-another-sale" {
				o.Status = StatusCancelled
			}
			if err := s.db.Create(&o).Error; err != nil {
				t.Fatal(err)
			}
			if err := tc.lay(s, o); err != nil {
				t.Fatal(err)
			}
			if o.Status == StatusCancelled {
				if err := s.returnInCurrentSale(o); err != nil {
					t.Fatal(err)
				}
			}
			r := s.audit()
			b, _ := json.Marshal(r)
			if r.OK || r.Drifts["misattributed_order_records"].Total == 0 {
				t.Fatalf("order %d: misattributed_order_records is 0: %s", o.ID, b)
			}
		})
	}
}

// move lays o's rows: for a paid order, a debit of its amount from the
// account from (the balance moved to match); a reservation of its
// quantity of sku (the stock moved to match), in sku's current sale.
func (s *shop) move(o Order, from int64, sku string) error {
	db := s.db
	if o.Status == StatusPaid {
		if err := db.Create(&account.LedgerEntry{AccountID: from, Amount: -o.AmountCents, Kind: account.KindOrder, OrderID: o.ID}).Error; err != nil {
			return err
		}
		if err := db.Exec("UPDATE accounts SET balance = balance - ? WHERE id = ?", o.AmountCents, from).Error; err != nil {
			return err
		}
	}
	if err := db.Exec(`INSERT INTO purchases (sku, user_id, quantity, strategy, fence, created_at, order_id, sale)
		SELECT ?, ?, ?, ?, 0, ?, ?, sale FROM products WHERE sku = ?`,
		sku, o.UserID, o.Quantity, inventory.StrategyOrder, time.Now().UTC(), o.ID, sku).Error; err != nil {
		return err
	}
	return db.Exec("UPDATE products SET stock = stock - ? WHERE sku = ?", o.Quantity, sku).Error
}

// returnInCurrentSale lays the return of o's units into its SKU's current
// sale, the stock moved to match.
func (s *shop) returnInCurrentSale(o Order) error {
	if err := s.db.Exec(`INSERT INTO purchases (sku, user_id, quantity, strategy, fence, created_at, order_id, sale)
		SELECT ?, ?, ?, ?, 0, ?, ?, sale FROM products WHERE sku = ?`,
		o.SKU, o.UserID, -o.Quantity, inventory.StrategyOrderReturn, time.Now().UTC(), o.ID, o.SKU).Error; err != nil {
		return err
	}
	return s.db.Exec("UPDATE products SET stock = stock + ? WHERE sku = ?", o.Quantity, o.SKU).Error
}
