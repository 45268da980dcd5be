package order

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/inventory"
)

// leftover is a state the saga of the previous version left behind, laid
// down row by row: the order as it stayed, the ledger rows and purchase
// rows its steps committed, with the balance and stock moved to match (so
// the per-row audits, balance_drift and stock_drift, see nothing wrong:
// that was the old audit's blind spot).
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

// Each state the old order flow was found to leave, as the issue describes
// it: the old checks (balance, stock, duplicates) call it clean, the order
// reconciliation does not.
func TestAuditCatchesWhatTheOldFlowLeft(t *testing.T) {
	oldView := []string{"balance_drift", "stock_drift", "oversold_units", "duplicate_orders"}
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
			for _, name := range oldView {
				if r.Drifts[name].Total != 0 {
					t.Fatalf("the old checks already saw it (%s): %s", name, b)
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
