package order

import (
	"context"
	"errors"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/inventory"
)

// LowerSKUs renames every product an earlier version stored with upper
// case in its SKU to the lower-case form, the only one a request may
// spell, with every row that names it (purchases, per-user totals,
// orders: the closer returns an order's stock to the product its row
// names), one product per transaction. A product whose lower-case form is
// taken by another stays as it is, unreachable, and is reported in the
// error (inventory.ErrSKUCollision); the others are renamed. Run it after
// the migration, before serving.
func LowerSKUs(ctx context.Context, db *gorm.DB) error {
	skus, err := inventory.UpperCaseSKUs(db.WithContext(ctx))
	if err != nil {
		return err
	}
	var collisions []error
	for _, sku := range skus {
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := inventory.LowerSKU(tx, sku); err != nil {
				return err
			}
			return tx.Model(&Order{}).Where("sku = ?", sku).Update("sku", gorm.Expr("LOWER(sku)")).Error
		})
		if errors.Is(err, inventory.ErrSKUCollision) {
			collisions = append(collisions, err)
		} else if err != nil {
			return err
		}
	}
	return errors.Join(collisions...)
}
