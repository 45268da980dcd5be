package account

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/optimistic"
)

// patient retries long enough that 32 racers all finish: the test counts
// exact outcomes, not where the bound lies.
var patient = optimistic.Policy{Attempts: 10_000, Base: 100 * time.Microsecond, Cap: 5 * time.Millisecond}

// TestOptimisticLosesNoUpdate: 32 goroutines race on two accounts with
// deposits, withdrawals and transfers both ways, with a 1 ms read-to-write
// window and no lock; every one succeeds, the balances are exactly what
// the sums say, and the ledger explains them.
func TestOptimisticLosesNoUpdate(t *testing.T) {
	for dbName, newDB := range databases() {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			store := NewStore(newDB(t).DB)
			svc := NewService(store, Options{Strategy: StrategyOptimistic, Retry: optimistic.Retry{Policy: patient},
				Locking: guard.Locking{CriticalSectionDelay: time.Millisecond}})
			for id := int64(1); id <= 2; id++ {
				if _, err := store.Put(ctx, id, 100_000); err != nil {
					t.Fatal(err)
				}
			}
			raceMixedOps(t, ctx, svc)
			// 32 x 4 operations, each kind 32 times.
			want := map[int64]int64{1: 100_000 + 32*(100-30-7+5), 2: 100_000 + 32*(7-5)}
			for id, w := range want {
				if a, err := store.Get(ctx, id); err != nil || a.Balance != w {
					t.Errorf("account %d: balance %d (%v), want %d", id, a.Balance, err, w)
				}
			}
			if d, err := store.Drift(ctx); err != nil || len(d) != 0 {
				t.Errorf("drift %v (%v), want none", d, err)
			}
		})
	}
}

// raceMixedOps starts 32 goroutines together, each running 4 operations
// in turn: a deposit of 100 and a withdrawal of 30 on account 1, a
// transfer of 7 from 1 to 2 and one of 5 back.
func raceMixedOps(t *testing.T, ctx context.Context, svc Service) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for g := range 32 {
		wg.Go(func() {
			<-start
			for i := range 4 {
				if err := mixedOp(ctx, svc, (g+i)%4); err != nil {
					t.Errorf("goroutine %d, op %d: %v", g, i, err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
}

// mixedOp runs operation n of raceMixedOps' four.
func mixedOp(ctx context.Context, svc Service, n int) error {
	var err error
	switch n {
	case 0:
		_, err = svc.Deposit(ctx, 1, 100, Precondition{})
	case 1:
		_, err = svc.Withdraw(ctx, 1, 30, Precondition{})
	case 2:
		_, err = svc.Transfer(ctx, 1, 2, 7)
	case 3:
		_, err = svc.Transfer(ctx, 2, 1, 5)
	}
	return err
}

// TestNoLockLosesUpdates is the baseline beside it: the same read-modify-
// write under lockkit.None loses deposits, and the audit counts them.
func TestNoLockLosesUpdates(t *testing.T) {
	ctx := context.Background()
	store := sqliteStore(t)
	svc := NewService(store, Options{Locking: guard.Locking{Locker: lockkit.None(), CriticalSectionDelay: time.Millisecond}})
	if _, err := store.Put(ctx, 1, 0); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range 32 {
		wg.Go(func() {
			<-start
			if _, err := svc.Deposit(ctx, 1, 100, Precondition{}); err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	a, _ := store.Get(ctx, 1)
	d, _ := store.Drift(ctx)
	t.Logf("without a lock: balance %d after 32 deposits of 100, drift %v", a.Balance, d)
	if a.Balance >= 3200 || d["1"] != a.Balance-3200 {
		t.Errorf("balance %d, drift %v; want less than 3200 and the loss counted", a.Balance, d)
	}
}

// TestOptimisticGivesUpWithConflict: when the row moves under every
// attempt, the withdrawal ends with optimistic.ErrConflict after exactly
// the policy's attempts, and nothing is written.
func TestOptimisticGivesUpWithConflict(t *testing.T) {
	ctx := context.Background()
	store := sqliteStore(t)
	if _, err := store.Put(ctx, 1, 1000); err != nil {
		t.Fatal(err)
	}
	attempts := 0
	svc := NewService(store, Options{Strategy: StrategyOptimistic,
		Retry: optimistic.Retry{Policy: optimistic.Policy{Attempts: 3, Base: time.Millisecond, Cap: time.Millisecond}}})
	store.beforeWrite = func(context.Context) {
		attempts++
		if err := store.db.Exec("UPDATE accounts SET version = version + 1 WHERE id = 1").Error; err != nil {
			t.Error(err)
		}
	}
	_, err := svc.Withdraw(ctx, 1, 10, Precondition{})
	if !errors.Is(err, optimistic.ErrConflict) || attempts != 3 {
		t.Fatalf("got %v after %d attempts, want ErrConflict after 3", err, attempts)
	}
	if a, _ := store.Get(ctx, 1); a.Balance != 1000 {
		t.Errorf("balance %d, want 1000: a conflict writes nothing", a.Balance)
	}
}
