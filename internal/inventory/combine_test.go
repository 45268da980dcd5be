package inventory

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
)

// TestCombinedSellsExactlyTheStock: 64 buyers at once, stock 20, the lock
// strategy combining up to 8 purchases per grant: exactly 20 sold, 44 sold
// out, no drift, and fewer grants than sales (the batches happened).
func TestCombinedSellsExactlyTheStock(t *testing.T) {
	for dbName, newDB := range databases(t) {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			store := NewStore(newDB(t).DB, nil)
			locker := local.New()
			defer locker.Close()
			svc, err := NewService(store, Options{Strategy: StrategyLock, Combine: 8,
				Locking: guard.Locking{Locker: locker, CriticalSectionDelay: time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.Put(ctx, Product{SKU: "hot", Name: "hot", Stock: 20, PriceCents: 1}); err != nil {
				t.Fatal(err)
			}
			sold, soldOut, _ := buyAll(t, svc, "hot", 64, func(i int) int64 { return int64(i + 1) })
			if sold != 20 || soldOut != 44 {
				t.Errorf("sold %d, sold out %d; want 20 and 44", sold, soldOut)
			}
			if p, err := store.Get(ctx, "hot"); err != nil || p.Stock != 0 {
				t.Errorf("stock %d (%v), want 0", p.Stock, err)
			}
			assertNoDrift(t, store)
			var grants int64
			if err := store.db.Raw("SELECT COUNT(DISTINCT fence) FROM purchases WHERE sku = 'hot'").Scan(&grants).Error; err != nil {
				t.Fatal(err)
			}
			t.Logf("20 units sold under %d grants", grants)
			if grants >= 20 {
				t.Errorf("%d grants for 20 sales: nothing was combined", grants)
			}

			// A product with a per-user limit takes the single path, and
			// the limit holds.
			if _, err := store.Put(ctx, Product{SKU: "lim", Name: "lim", Stock: 100, PriceCents: 1, PerUserLimit: 3}); err != nil {
				t.Fatal(err)
			}
			sold, _, limited := buyAll(t, svc, "lim", 12, func(int) int64 { return 7 })
			if sold != 3 || limited != 9 {
				t.Errorf("one user, limit 3: sold %d, limited %d; want 3 and 9", sold, limited)
			}
			assertNoDrift(t, store)
		})
	}
}

// TestStaleBatchIsRefusedWhole: a batch written under a token that a newer
// one has beaten writes nothing: no unit of it is sold.
func TestStaleBatchIsRefusedWhole(t *testing.T) {
	ctx := context.Background()
	store := NewStore(open(t, sqliteOptions(t)).DB, nil)
	if _, err := store.Put(ctx, Product{SKU: "b", Name: "b", Stock: 10, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	if err := store.db.Exec("UPDATE products SET fence = 9").Error; err != nil {
		t.Fatal(err)
	}
	ps := []Purchase{{SKU: "b", UserID: 1, Quantity: 1, Fence: 8}, {SKU: "b", UserID: 2, Quantity: 1, Fence: 8}}
	sold := make([]bool, len(ps))
	if err := store.updateMany(ctx, "b", 8, batch{purchases: ps, sold: sold, buyers: make([]context.Context, len(ps))}, 0); !errors.Is(err, lockkit.ErrFenced) {
		t.Fatalf("stale batch: %v, want ErrFenced", err)
	}
	if p, _ := store.Get(ctx, "b"); p.Stock != 10 || sold[0] || sold[1] {
		t.Errorf("stock %d, sold %v; want 10 and none", p.Stock, sold)
	}
	assertNoDrift(t, store)
}

// announcingLocker grants through local, and tells acquiring when a grant
// is asked for: from then on, a batch's buyers wait for the lock.
type announcingLocker struct {
	lockkit.Locker
	acquiring chan struct{}
}

func (a announcingLocker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	a.acquiring <- struct{}{}
	return a.Locker.Acquire(ctx, key, opts...)
}

// waitingBatch starts serving buyers as one batch of sku while another
// holder keeps sku's lock, and returns once the batch waits for the
// grant, with the release of that lock.
func waitingBatch(t *testing.T, store *Store, sku string, buyers ...*queued) (release func()) {
	t.Helper()
	ctx := context.Background()
	l := local.New()
	t.Cleanup(func() { l.Close() })
	held, err := l.Acquire(ctx, Key(sku).String())
	if err != nil {
		t.Fatal(err)
	}
	acquiring := make(chan struct{}, 1)
	// The wait timeout is only a backstop: a batch that outlived its
	// buyers is answered ErrNotAcquired a minute later instead of hanging.
	svc, err := NewService(store, Options{Strategy: StrategyLock, Combine: 8, Locking: guard.Locking{
		Locker: announcingLocker{l, acquiring}, LockOptions: []lockkit.Option{lockkit.WithWaitTimeout(time.Minute)}}})
	if err != nil {
		t.Fatal(err)
	}
	go svc.(*combined).serve(sku, buyers)
	<-acquiring
	return func() { _ = held.Release(ctx) }
}

func newQueued(ctx context.Context, user int64) *queued {
	return &queued{ctx: ctx, user: user, quantity: 1, done: make(chan queuedResult, 1), lead: make(chan struct{}, 1)}
}

// TestCombinedBuyerWhoLeftWhileTheBatchWaitedIsNotSold: a buyer whose
// request ends while its batch waits for the lock is answered with its
// context's error and sold nothing; the buyer who stayed is sold its unit.
func TestCombinedBuyerWhoLeftWhileTheBatchWaitedIsNotSold(t *testing.T) {
	ctx := context.Background()
	store := NewStore(open(t, sqliteOptions(t)).DB, nil)
	if _, err := store.Put(ctx, Product{SKU: "b", Name: "b", Stock: 10, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	leaving, leave := context.WithCancel(ctx)
	stays, leaves := newQueued(ctx, 1), newQueued(leaving, 2)
	release := waitingBatch(t, store, "b", stays, leaves)
	leave()
	release()
	if r := <-stays.done; r.err != nil {
		t.Errorf("the buyer who stayed: %v, want sold", r.err)
	}
	if r := <-leaves.done; !errors.Is(r.err, context.Canceled) {
		t.Errorf("the buyer who left: %+v, want context.Canceled", r)
	}
	var rows int64
	if err := store.db.Model(&Purchase{}).Where("user_id = ?", 2).Count(&rows).Error; err != nil || rows != 0 {
		t.Errorf("the buyer who left has %d purchase rows (%v), want 0", rows, err)
	}
	if p, _ := store.Get(ctx, "b"); p.Stock != 9 {
		t.Errorf("stock %d, want 9", p.Stock)
	}
	assertNoDrift(t, store)
}

// TestCombinedBatchStopsWaitingWhenEveryBuyerLeft: a batch whose buyers
// all left (a shutdown cancels every request) stops waiting for the lock
// at once, with their error, instead of holding the shutdown up for the
// lock's wait timeout.
func TestCombinedBatchStopsWaitingWhenEveryBuyerLeft(t *testing.T) {
	ctx := context.Background()
	store := NewStore(open(t, sqliteOptions(t)).DB, nil)
	if _, err := store.Put(ctx, Product{SKU: "b", Name: "b", Stock: 10, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	shutdown, stop := context.WithCancel(ctx)
	buyers := []*queued{newQueued(shutdown, 1), newQueued(shutdown, 2)}
	release := waitingBatch(t, store, "b", buyers...)
	defer release()
	stop()
	for i, o := range buyers {
		if r := <-o.done; !errors.Is(r.err, context.Canceled) {
			t.Errorf("buyer %d: %+v, want context.Canceled", i+1, r)
		}
	}
	if p, _ := store.Get(ctx, "b"); p.Stock != 10 {
		t.Errorf("stock %d, want 10", p.Stock)
	}
}

// TestCombinedBuyerQueuesNoLongerThanTheLockWaitBudget: a buyer queued
// behind a batch that does not end gives up once the lock wait budget has
// passed, sold nothing (ErrNotAcquired, as a buyer on the single path
// that waited as long for the lock), instead of waiting as long as that
// batch takes. The queue serves the next buyer as before.
func TestCombinedBuyerQueuesNoLongerThanTheLockWaitBudget(t *testing.T) {
	ctx := context.Background()
	store := NewStore(open(t, sqliteOptions(t)).DB, nil)
	locker := local.New()
	defer locker.Close()
	svc, err := NewService(store, Options{Strategy: StrategyLock, Combine: 8, Locking: guard.Locking{
		Locker: locker, LockOptions: []lockkit.Option{lockkit.WithWaitTimeout(100 * time.Millisecond)}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(ctx, Product{SKU: "hot", Name: "hot", Stock: 10, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	paused, wake := make(chan struct{}), make(chan struct{})
	var pausing, waking sync.Once
	release := func() { waking.Do(func() { close(wake) }) }
	t.Cleanup(release)
	store.beforeWrite = func(context.Context) { pausing.Do(func() { close(paused) }); <-wake }

	first := make(chan error, 1)
	go func() { _, err := svc.Purchase(ctx, 1, "hot", 1); first <- err }()
	<-paused
	queued := make(chan error, 1)
	go func() { _, err := svc.Purchase(ctx, 2, "hot", 1); queued <- err }()
	select {
	case err := <-queued:
		if !errors.Is(err, lockkit.ErrNotAcquired) {
			t.Errorf("buyer queued past its wait budget: %v, want ErrNotAcquired", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a buyer queued behind a batch that does not end still waits, 100 times its wait budget later")
	}
	release()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Purchase(ctx, 3, "hot", 1); err != nil {
		t.Fatalf("a buyer after one that gave up: %v", err)
	}
	if p, err := store.Get(ctx, "hot"); err != nil || p.Stock != 8 {
		t.Errorf("stock %d (%v), want 8: two sold, the one that gave up not", p.Stock, err)
	}
	assertNoDrift(t, store)
}
