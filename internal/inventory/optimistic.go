package inventory

import (
	"context"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/optimistic"
)

// optimisticPurchase reads, checks and writes without a lock: the write
// lands only if the row still has the version it read, and a purchase that
// lost the race reads again (optimistic.Retry), up to the policy's bound.
type optimisticPurchase struct {
	store *Store
	delay time.Duration
	retry optimistic.Retry
}

func newOptimistic(store *Store, o Options) *optimisticPurchase {
	return &optimisticPurchase{store: store, delay: o.CriticalSectionDelay, retry: o.Retry}
}

func (s *optimisticPurchase) Get(ctx context.Context, sku string) (Product, error) {
	return s.store.Get(ctx, sku)
}

func (s *optimisticPurchase) Purchase(ctx context.Context, user int64, sku string, quantity int64) (Purchase, error) {
	if err := validate(sku, quantity); err != nil {
		return Purchase{}, err
	}
	var p Purchase
	err := s.retry.Do(ctx, "stock", func(ctx context.Context) error {
		prod, err := s.store.Get(ctx, sku)
		if err != nil {
			return err
		}
		if prod.Stock < quantity {
			return soldOut(prod.Stock, quantity)
		}
		if err := guard.Work(ctx, s.delay); err != nil {
			return err
		}
		p = Purchase{SKU: sku, UserID: user, Quantity: quantity, Strategy: StrategyOptimistic}
		keyed.Result(ctx, &p)
		return s.store.writeVersioned(ctx, &p, prod, prod.Stock-quantity)
	})
	return p, err
}

// writeVersioned writes stock over the product as read (its version and
// stock) with the per-user limit and the purchase row, in one transaction.
// optimistic.ErrMoved when the row changed since: nothing is written.
//
// The WHERE checks the stock read as well as the version: a writer that
// does not bump the version (a tool, an older binary during a rolling
// deploy) still cannot have its change overwritten.
func (s *Store) writeVersioned(ctx context.Context, p *Purchase, read Product, stock int64) error {
	if s.beforeWrite != nil {
		s.beforeWrite(ctx)
	}
	// Detached from the request, as Update's write is: a transaction cut
	// half-way would leave its outcome unknown to the client.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	return s.db.WithContext(wctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Exec("UPDATE products SET stock = ?, version = version + 1, updated_at = ? WHERE sku = ? AND version = ? AND stock = ?",
			stock, time.Now().UTC(), read.SKU, read.Version, read.Stock)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			return fmt.Errorf("%w: product %q", optimistic.ErrMoved, read.SKU)
		}
		if err := countLimit(tx, read, *p); err != nil {
			return err
		}
		if err := insertInSale(tx, p); err != nil {
			return err
		}
		return keyed.Save(ctx, tx)
	})
}
