package inventory

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/instrument"
	"github.com/lockbench/shop/internal/lockkit/local"
)

// staleLocker grants through local but hands out a token the product row
// has already beaten, and is slow to grant, so that buyers queue into
// batches meanwhile.
type staleLocker struct {
	lockkit.Locker
	grants atomic.Int64
}

func (s *staleLocker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	time.Sleep(30 * time.Millisecond)
	l, err := s.Locker.Acquire(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	s.grants.Add(1)
	return staleLease{l}, nil
}

type staleLease struct{ lockkit.Lease }

func (staleLease) Fence() uint64 { return 1 }

// TestCombinedCountsEveryFencedBuyer: with buyers combined, a batch
// refused by its fence answers every buyer in it ErrFenced, and
// shop_fenced_writes_total{class="stock"} counts each of those answers,
// as it did when a metrics decorator counted every Purchase that returned
// ErrFenced: one count per refused purchase, not one per grant.
func TestCombinedCountsEveryFencedBuyer(t *testing.T) {
	ctx := context.Background()
	store := NewStore(open(t, sqliteOptions(t)).DB, nil)
	if _, err := store.Put(ctx, Product{SKU: "stale", Name: "stale", Stock: 100, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	if err := store.db.Exec("UPDATE products SET fence = 9").Error; err != nil {
		t.Fatal(err)
	}
	inner := local.New()
	defer inner.Close()
	locker := &staleLocker{Locker: inner}
	reg := prometheus.NewRegistry()
	m := instrument.NewMetrics(reg, "local")
	svc, err := NewService(store, Options{Strategy: StrategyLock, Combine: 8,
		Locking: guard.Locking{Locker: locker, Metrics: m}})
	if err != nil {
		t.Fatal(err)
	}

	const buyers = 8
	var (
		wg      sync.WaitGroup
		start   = make(chan struct{})
		refused atomic.Int64
	)
	for i := range buyers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := svc.Purchase(ctx, int64(i+1), "stale", 1)
			if !errors.Is(err, lockkit.ErrFenced) {
				t.Errorf("buyer %d: %v, want ErrFenced", i, err)
				return
			}
			refused.Add(1)
		}()
	}
	close(start)
	wg.Wait()
	if locker.grants.Load() >= buyers {
		t.Fatalf("%d grants for %d buyers: nothing was combined, the test proves nothing", locker.grants.Load(), buyers)
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var counted float64
	for _, mf := range mfs {
		if mf.GetName() != "shop_fenced_writes_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			for _, lp := range s.GetLabel() {
				if lp.GetName() == "class" && lp.GetValue() == "stock" {
					counted += s.GetCounter().GetValue()
				}
			}
		}
	}
	if counted != float64(refused.Load()) {
		t.Errorf("shop_fenced_writes_total{class=\"stock\"} = %v for %d purchases refused as fenced (%d grants)",
			counted, refused.Load(), locker.grants.Load())
	}
}
