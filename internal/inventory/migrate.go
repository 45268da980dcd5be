package inventory

import (
	"errors"
	"fmt"
	"strings"

	"gorm.io/gorm"
)

// ErrSKUCollision: a SKU an earlier version stored with upper case differs
// from another product's only in case, so it cannot take its lower-case
// form; the admin must rename or delete one of them.
var ErrSKUCollision = errors.New("inventory: SKUs that differ only in case")

// LowerSKU renames, in tx, product sku (a SKU stored with upper case by an
// earlier version, which ValidSKU now refuses, so no request reaches it)
// to its lower-case form, with its purchases and per-user totals. The
// product's fence goes back to 0: its tokens came from the old key's
// counter, which the new key does not continue, and a holder of the old
// key misses the renamed row anyway. The caller renames the rows of other
// domains that name sku in the same tx.
func LowerSKU(tx *gorm.DB, sku string) error {
	lower := strings.ToLower(sku)
	var taken int64
	if err := tx.Model(&Product{}).Where("sku = ?", lower).Count(&taken).Error; err != nil {
		return err
	}
	if taken > 0 {
		return fmt.Errorf("%w: %q and %q", ErrSKUCollision, sku, lower)
	}
	if err := tx.Exec("UPDATE products SET sku = ?, fence = 0 WHERE sku = ?", lower, sku).Error; err != nil {
		return err
	}
	for _, table := range []string{"purchases", "purchase_limits"} {
		if err := tx.Exec("UPDATE "+table+" SET sku = ? WHERE sku = ?", lower, sku).Error; err != nil {
			return err
		}
	}
	return nil
}

// UpperCaseSKUs lists the products stored with upper case in their SKU.
func UpperCaseSKUs(tx *gorm.DB) ([]string, error) {
	var skus, out []string
	if err := tx.Model(&Product{}).Pluck("sku", &skus).Error; err != nil {
		return nil, err
	}
	for _, sku := range skus {
		if sku != strings.ToLower(sku) {
			out = append(out, sku)
		}
	}
	return out, nil
}
