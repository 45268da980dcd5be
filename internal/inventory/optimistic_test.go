package inventory

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/optimistic"
	"github.com/lockbench/shop/internal/storage"
)

func sqliteOptions(t *testing.T) storage.Options {
	return storage.Options{SQLitePath: t.TempDir() + "/inv.db"}
}

// patient retries long enough that 32 racers all finish: the test counts
// exact outcomes, not where the bound lies.
var patient = optimistic.Policy{Attempts: 10_000, Base: 100 * time.Microsecond, Cap: 5 * time.Millisecond}

// TestOptimisticSellsExactlyTheStock: 32 goroutines buy 3 units each, one
// at a time, of a stock of 64, with a 1 ms read-to-write window; the
// versioned write lets exactly 64 through, the stock ends at 0, every
// other purchase is sold out, and the audit finds nothing.
func TestOptimisticSellsExactlyTheStock(t *testing.T) {
	for dbName, newDB := range databases(t) {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			store := NewStore(newDB(t).DB, nil)
			m := optimistic.NewMetrics(prometheus.NewRegistry())
			svc, err := NewService(store, Options{Strategy: StrategyOptimistic, Retry: optimistic.Retry{Policy: patient, Metrics: m},
				Locking: guard.Locking{CriticalSectionDelay: time.Millisecond}})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := store.Put(ctx, Product{SKU: "opt", Name: "opt", Stock: 64, PriceCents: 1}); err != nil {
				t.Fatal(err)
			}
			var (
				mu            sync.Mutex
				sold, soldOut int
				wg            sync.WaitGroup
				start         = make(chan struct{})
			)
			for g := range 32 {
				wg.Go(func() {
					<-start
					for range 3 {
						_, err := svc.Purchase(ctx, int64(g+1), "opt", 1)
						mu.Lock()
						switch {
						case err == nil:
							sold++
						case errors.Is(err, ErrSoldOut):
							soldOut++
						default:
							t.Errorf("purchase: %v", err)
						}
						mu.Unlock()
					}
				})
			}
			close(start)
			wg.Wait()
			if sold != 64 || soldOut != 32 {
				t.Errorf("sold %d, sold out %d; want 64 and 32", sold, soldOut)
			}
			if p, err := store.Get(ctx, "opt"); err != nil || p.Stock != 0 || p.Version != 64 {
				t.Errorf("stock %d version %d (%v), want 0 and 64 (one bump per sale)", p.Stock, p.Version, err)
			}
			assertNoDrift(t, store)
		})
	}
}

// TestOptimisticGivesUpWithConflict: when the row moves under every
// attempt, the purchase ends with optimistic.ErrConflict after exactly the
// policy's attempts, and nothing is written.
func TestOptimisticGivesUpWithConflict(t *testing.T) {
	ctx := context.Background()
	store := NewStore(open(t, sqliteOptions(t)).DB, nil)
	if _, err := store.Put(ctx, Product{SKU: "moving", Name: "m", Stock: 10, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	attempts := 0
	// Another writer bumps the version between every read and write.
	store.beforeWrite = func(context.Context) {
		attempts++
		if err := store.db.Exec("UPDATE products SET version = version + 1 WHERE sku = 'moving'").Error; err != nil {
			t.Error(err)
		}
	}
	svc, err := NewService(store, Options{Strategy: StrategyOptimistic,
		Retry: optimistic.Retry{Policy: optimistic.Policy{Attempts: 3, Base: time.Millisecond, Cap: time.Millisecond}}})
	if err != nil {
		t.Fatal(err)
	}
	_, err = svc.Purchase(ctx, 1, "moving", 1)
	if !errors.Is(err, optimistic.ErrConflict) || attempts != 3 {
		t.Fatalf("got %v after %d attempts, want ErrConflict after 3", err, attempts)
	}
	if p, _ := store.Get(ctx, "moving"); p.Stock != 10 {
		t.Errorf("stock %d, want 10: a conflict writes nothing", p.Stock)
	}
	assertNoDrift(t, store)
}

// TestLockWriteRefusesAnOptimisticWriteItMissed: during a rolling switch of
// SHOP_STOCK_STRATEGY a lock holder and an optimistic buyer write the same
// row; an optimistic sale that lands between the holder's read and write
// must not be overwritten by it.
func TestLockWriteRefusesAnOptimisticWriteItMissed(t *testing.T) {
	ctx := context.Background()
	store := NewStore(open(t, sqliteOptions(t)).DB, nil)
	other := NewStore(store.db, nil)
	if _, err := store.Put(ctx, Product{SKU: "mixed", Name: "m", Stock: 10, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	opt, err := NewService(other, Options{Strategy: StrategyOptimistic})
	if err != nil {
		t.Fatal(err)
	}
	store.beforeWrite = func(context.Context) {
		if _, err := opt.Purchase(ctx, 2, "mixed", 1); err != nil {
			t.Error(err)
		}
	}
	p := Purchase{SKU: "mixed", UserID: 1, Quantity: 1, Strategy: StrategyLock}
	err = store.Update(ctx, &p, 7, func(_ context.Context, prod *Product) error { prod.Stock--; return nil })
	if !errors.Is(err, optimistic.ErrConflict) {
		t.Errorf("lock write over a missed optimistic sale: %v, want ErrConflict", err)
	}
	if got, _ := store.Get(ctx, "mixed"); got.Stock != 9 {
		t.Errorf("stock %d, want 9: the optimistic sale only", got.Stock)
	}
	assertNoDrift(t, store)
}
