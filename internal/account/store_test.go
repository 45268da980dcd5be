package account

import (
	"context"
	"testing"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
)

// The version is the account's ETag, so every write of a balance must move
// it, whatever wrote it: a change under a fenced lock, under no lock, an
// optimistic one, an order's debit, an admin put and an admin reset.
func TestEveryBalanceChangeMovesTheVersion(t *testing.T) {
	for dbName, newDB := range databases() {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			db := newDB(t)
			store := NewStore(db.DB)
			locker := local.New()
			defer locker.Close()
			fenced := NewService(store, Options{Locking: guard.Locking{Locker: locker}})
			unlocked := NewService(store, Options{Locking: guard.Locking{Locker: lockkit.None()}})
			optimistic := NewService(store, Options{Strategy: StrategyOptimistic})
			if _, err := store.Put(ctx, 1, 100_000); err != nil {
				t.Fatal(err)
			}
			for _, step := range []struct {
				name   string
				change func() error
			}{
				{"deposit-fenced", func() error { _, err := fenced.Deposit(ctx, 1, 1, Precondition{}); return err }},
				{"withdraw-unfenced", func() error { _, err := unlocked.Withdraw(ctx, 1, 1, Precondition{}); return err }},
				{"deposit-optimistic", func() error { _, err := optimistic.Deposit(ctx, 1, 1, Precondition{}); return err }},
				{"transfer-fenced", func() error {
					if _, err := store.Put(ctx, 2, 0); err != nil {
						return err
					}
					_, err := fenced.Transfer(ctx, 1, 2, 1)
					return err
				}},
				{"order-debit", func() error {
					return db.DB.Transaction(func(tx *gorm.DB) error { return Debit(tx, 1, 1, 0, 7) })
				}},
				{"admin-put", func() error { _, err := store.Put(ctx, 1, 5_000); return err }},
				{"admin-reset", func() error { return store.Reset(ctx, "default") }},
			} {
				before, err := store.Get(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				if err := step.change(); err != nil {
					t.Fatalf("%s: %v", step.name, err)
				}
				after, err := store.Get(ctx, 1)
				if err != nil {
					t.Fatal(err)
				}
				if after.Balance == before.Balance {
					t.Fatalf("%s left the balance at %d: the step proves nothing", step.name, after.Balance)
				}
				if after.Version == before.Version {
					t.Errorf("%s changed the balance %d → %d and left the version at %d", step.name, before.Balance, after.Balance, after.Version)
				}
			}
		})
	}
}
