package order

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/account"
)

// TestOrdersPaidBeforeAnAccountPutReconcile: an admin PUT of an account
// starts a new history, yet the orders paid in the old one stay paid, so
// the order audit must keep seeing their debits; the balance audit counts
// only the new history's rows. Before, the PUT deleted the ledger and every
// order paid before it showed as drifted: a false alarm.
func TestOrdersPaidBeforeAnAccountPutReconcile(t *testing.T) {
	s := newShop(t, Options{PayTimeout: time.Minute})
	ctx := context.Background()
	if _, _, err := s.service.Place(ctx, user, "k-paid", "widget", 3, true); err != nil {
		t.Fatal(err)
	}
	unpaid, _, err := s.service.Place(ctx, user, "k-unpaid", "widget", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.accounts.Put(ctx, user, opening); err != nil {
		t.Fatal(err)
	}
	s.auditOK()

	// Paid after the PUT, an order of the old history debits the new one.
	if _, err := s.service.Pay(ctx, user, unpaid.ID); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.service.Place(ctx, user, "k-new", "widget", 1, true); err != nil {
		t.Fatal(err)
	}
	s.auditOK()
	if got := s.state(); got.balance != opening-3*price || got.debits != 3 {
		t.Fatalf("%+v: want the opening less the 3 units paid since the PUT, and all 3 debits kept", got)
	}
}

// TestWrongMoneyAfterAnAccountPutIsReported: keeping the old history's rows
// must not hide a real drift on either side of the PUT: a debit row lost,
// of an order paid before or after it, or a balance moved without a row.
func TestWrongMoneyAfterAnAccountPutIsReported(t *testing.T) {
	for _, tc := range []struct {
		name        string
		damage      func(s *shop, before, after int64) error
		wantNonZero []string
	}{
		{"debit-lost-of-an-order-paid-before", func(s *shop, before, _ int64) error {
			return s.db.Where("order_id = ?", before).Delete(&account.LedgerEntry{}).Error
		}, []string{"unreconciled_order_cents", "miscounted_order_records"}},
		{"debit-lost-of-an-order-paid-after", func(s *shop, _, after int64) error {
			return s.db.Where("order_id = ?", after).Delete(&account.LedgerEntry{}).Error
		}, []string{"unreconciled_order_cents", "miscounted_order_records", "balance_drift"}},
		{"balance-moved-without-a-row", func(s *shop, _, _ int64) error {
			return s.db.Exec("UPDATE accounts SET balance = balance - 5 WHERE id = ?", user).Error
		}, []string{"balance_drift"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newShop(t, Options{PayTimeout: time.Minute})
			ctx := context.Background()
			before, _, err := s.service.Place(ctx, user, "k-before", "widget", 3, true)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.accounts.Put(ctx, user, opening); err != nil {
				t.Fatal(err)
			}
			after, _, err := s.service.Place(ctx, user, "k-after", "widget", 2, true)
			if err != nil {
				t.Fatal(err)
			}
			s.auditOK()
			if err := tc.damage(s, before.ID, after.ID); err != nil {
				t.Fatal(err)
			}
			r := s.audit()
			b, _ := json.Marshal(r)
			if r.OK {
				t.Fatalf("the audit says ok: %s", b)
			}
			for _, name := range tc.wantNonZero {
				if r.Drifts[name].Total == 0 {
					t.Errorf("%s is 0: %s", name, b)
				}
			}
		})
	}
}
