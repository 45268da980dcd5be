package account

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
)

// moneyAudit runs the account domain's checks and returns the report.
func moneyAudit(t *testing.T, s *Store) audit.Report {
	t.Helper()
	r, err := audit.New((&Domain{Store: s}).Checks(), nil).Audit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// TestAuditSeesMoneyThatDoesNotBalance: each account agrees with its own
// ledger, yet money appeared: a transfer credit with no debit anywhere
// (laid down by hand, the balance moved to match). The audit must count
// it as an unpaired transfer leg and as balances that no longer sum to the
// openings plus the money that came in and went out.
func TestAuditSeesMoneyThatDoesNotBalance(t *testing.T) {
	for dbName, open := range databases() {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			db := open(t)
			s := NewStore(db.DB)
			if err := s.Reset(ctx, "default"); err != nil {
				t.Fatal(err)
			}
			if err := db.DB.Create(&LedgerEntry{AccountID: 2, Amount: 500, Kind: "transfer"}).Error; err != nil {
				t.Fatal(err)
			}
			if err := db.DB.Exec("UPDATE accounts SET balance = balance + 500 WHERE id = 2").Error; err != nil {
				t.Fatal(err)
			}
			r := moneyAudit(t, s)
			b, _ := json.Marshal(r)
			if r.OK {
				t.Fatalf("the audit says ok: %s", b)
			}
			if d := r.Drifts["balance_drift"]; d.Total != 0 {
				t.Errorf("balance_drift %d, want 0: each account agrees with its ledger", d.Total)
			}
			for _, name := range []string{"unpaired_transfer_cents", "unbalanced_money_cents"} {
				if d := r.Drifts[name]; d.Total != 500 {
					t.Errorf("%s %d, want 500: %s", name, d.Total, b)
				}
			}
		})
	}
}

// TestTransfersAndPutsKeepMoneyBalanced: real transfers pair up, and a put
// that replaces one side of a transfer (a new history, its own opening)
// leaves nothing to report either.
func TestTransfersAndPutsKeepMoneyBalanced(t *testing.T) {
	for dbName, open := range databases() {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			db := open(t)
			s := NewStore(db.DB)
			if err := s.Reset(ctx, "default"); err != nil {
				t.Fatal(err)
			}
			locked := NewService(s, Options{Locking: guard.Locking{Locker: lockkit.None()}})
			optimistic := NewService(s, Options{Strategy: StrategyOptimistic})
			for i, tr := range [][3]int64{{1, 2, 700}, {2, 3, 300}, {3, 1, 50}} {
				svc := []Service{locked, optimistic}[i%2]
				if _, err := svc.Transfer(ctx, tr[0], tr[1], tr[2]); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := locked.Deposit(ctx, 4, 1000, Precondition{}); err != nil {
				t.Fatal(err)
			}
			if r := moneyAudit(t, s); !r.OK {
				b, _ := json.Marshal(r)
				t.Fatalf("after transfers: %s", b)
			}
			if _, err := s.Put(ctx, 1, 5); err != nil {
				t.Fatal(err)
			}
			if r := moneyAudit(t, s); !r.OK {
				b, _ := json.Marshal(r)
				t.Fatalf("after a put of one side: %s", b)
			}
		})
	}
}
