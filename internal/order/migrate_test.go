package order

import (
	"context"
	"errors"
	"testing"

	"github.com/lockbench/shop/internal/inventory"
)

// TestLowerSKUsRenamesWhatEarlierVersionsStored: a product an earlier
// version stored as "Phone-X" (SKUs may no longer be spelled so) takes the
// name "phone-x" with its purchases and orders, and can be sold again; one
// whose lower-case form another product has stays as it was, reported.
func TestLowerSKUsRenamesWhatEarlierVersionsStored(t *testing.T) {
	ctx := context.Background()
	s := newShop(t, Options{})
	for _, sku := range []string{"Phone-X", "Widget"} {
		if _, err := s.products.Put(ctx, inventory.Product{SKU: sku, Name: sku, Stock: 5, PriceCents: 1}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.db.Exec("UPDATE products SET fence = 99 WHERE sku = 'Phone-X'").Error; err != nil {
		t.Fatal(err)
	}
	old := Order{UserID: user, IdempotencyKey: "k", SKU: "Phone-X", Quantity: 1, AmountCents: 1, Status: StatusAwaitingPayment, CreatedAt: now()}
	if err := s.db.Create(&old).Error; err != nil {
		t.Fatal(err)
	}
	if err := s.db.Create(&inventory.Purchase{SKU: "Phone-X", UserID: user, Quantity: 1, Strategy: "lock", OrderID: old.ID}).Error; err != nil {
		t.Fatal(err)
	}

	err := LowerSKUs(ctx, s.db.DB)
	if !errors.Is(err, inventory.ErrSKUCollision) {
		t.Errorf("Widget beside widget: %v, want ErrSKUCollision", err)
	}
	p, err := s.products.Get(ctx, "phone-x")
	if err != nil || p.Fence != 0 || p.Stock != 5 {
		t.Fatalf("phone-x: %+v (%v), want the renamed product with fence 0", p, err)
	}
	var rows struct{ Purchases, Orders, Widgets int64 }
	s.db.Model(&inventory.Purchase{}).Where("sku = ?", "phone-x").Count(&rows.Purchases)
	s.db.Model(&Order{}).Where("sku = ?", "phone-x").Count(&rows.Orders)
	s.db.Model(&inventory.Product{}).Where("sku IN ?", []string{"Widget", "widget"}).Count(&rows.Widgets)
	if rows.Purchases != 1 || rows.Orders != 1 || rows.Widgets != 2 {
		t.Errorf("rows %+v, want the purchase and the order renamed and both widgets kept", rows)
	}
	if o := s.place(`{"sku":"phone-x","quantity":1,"pay":true}`); o.Status != StatusPaid {
		t.Errorf("order of the renamed product: %+v", o)
	}
}
