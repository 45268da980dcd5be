package account

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/storage"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// database/sql's opener ends asynchronously after Close.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
	)
}

func sqliteStore(t *testing.T) *Store {
	t.Helper()
	db, err := storage.Open(context.Background(), storage.Options{SQLitePath: t.TempDir() + "/acct.db"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Migrate(context.Background(), Models()...); err != nil {
		t.Fatal(err)
	}
	return NewStore(db.DB)
}

// TestOppositeTransfersNeitherDeadlockNorLose: 100 transfers at once, half
// 1→2 and half 2→1, under a lock with a short wait timeout: all succeed (the
// keys are taken in sorted order, so no cycle can form), money is
// conserved, and the ledger explains every balance.
func TestOppositeTransfersNeitherDeadlockNorLose(t *testing.T) {
	ctx := context.Background()
	store := sqliteStore(t)
	locker := local.New()
	defer locker.Close()
	svc := NewService(store, Options{Locking: guard.Locking{Locker: lockkit.Reentrant(locker),
		LockOptions: []lockkit.Option{lockkit.WithWaitTimeout(20 * time.Second)}, CriticalSectionDelay: time.Millisecond}})
	for id := int64(1); id <= 2; id++ {
		if _, err := store.Put(ctx, id, 10_000); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, 100)
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			from, to := int64(1), int64(2)
			if i%2 == 1 {
				from, to = to, from
			}
			<-start
			_, err := svc.Transfer(ctx, from, to, int64(i+1))
			errs <- err
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("transfer: %v", err)
		}
	}
	a, _ := store.Get(ctx, 1)
	b, _ := store.Get(ctx, 2)
	// Odd i send i+1 from 2 to 1, even i send i+1 from 1 to 2.
	var net int64
	for i := range 100 {
		if i%2 == 0 {
			net -= int64(i + 1)
		} else {
			net += int64(i + 1)
		}
	}
	if a.Balance != 10_000+net || a.Balance+b.Balance != 20_000 {
		t.Errorf("balances %d and %d, want %d and %d", a.Balance, b.Balance, 10_000+net, 10_000-net)
	}
	if d, err := store.Drift(ctx); err != nil || len(d) != 0 {
		t.Errorf("drift %v (%v)", d, err)
	}
}

func TestRules(t *testing.T) {
	ctx := context.Background()
	store := sqliteStore(t)
	svc := NewService(store, Options{Locking: guard.Locking{Locker: lockkit.None()}})
	if _, err := store.Put(ctx, 1, 100); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(ctx, 2, math.MaxInt64-10); err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		op   func() error
		want error
	}{
		"withdraw-insufficient": {func() error { _, err := svc.Withdraw(ctx, 1, 101, Precondition{}); return err }, ErrInsufficientFunds},
		"withdraw-zero":         {func() error { _, err := svc.Withdraw(ctx, 1, 0, Precondition{}); return err }, ErrInvalidAmount},
		"deposit-overflow":      {func() error { _, err := svc.Deposit(ctx, 2, 11, Precondition{}); return err }, ErrOverflow},
		"deposit-unknown":       {func() error { _, err := svc.Deposit(ctx, 3, 1, Precondition{}); return err }, ErrNotFound},
		"transfer-same":         {func() error { _, err := svc.Transfer(ctx, 1, 1, 1); return err }, ErrSameAccount},
		"transfer-overflow":     {func() error { _, err := svc.Transfer(ctx, 1, 2, 11); return err }, ErrOverflow},
		"transfer-unknown":      {func() error { _, err := svc.Transfer(ctx, 1, 3, 1); return err }, ErrNotFound},
	} {
		if err := tc.op(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
	}
	a, _ := store.Get(ctx, 1)
	if a.Balance != 100 {
		t.Errorf("refused operations changed the balance to %d", a.Balance)
	}

	// Fences: a write below or equal to the row's token is refused.
	write := func(fence uint64) error {
		return store.Update(ctx, "deposit", []int64{1}, map[int64]uint64{1: fence},
			func(_ context.Context, accts []*Account) error { accts[0].Balance++; return nil })
	}
	if err := write(9); err != nil {
		t.Fatal(err)
	}
	for _, stale := range []uint64{8, 9} {
		if err := write(stale); !errors.Is(err, lockkit.ErrFenced) {
			t.Errorf("token %d after 9: %v, want ErrFenced", stale, err)
		}
	}
	if err := write(0); err != nil { // unfenced backend: written, fence kept
		t.Fatal(err)
	}
	if err := write(10); err != nil {
		t.Fatal(err)
	}
	a, _ = store.Get(ctx, 1)
	if a.Balance != 103 || a.Fence != 10 {
		t.Errorf("balance %d fence %d, want 103 and 10", a.Balance, a.Fence)
	}
	if d, err := store.Drift(ctx); err != nil || len(d) != 0 {
		t.Errorf("drift %v (%v)", d, err)
	}
}
