package order

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/inventory"
)

// TestCloseAfterANewSaleReturnsNothing: an admin PUT of a product starts a
// new sale; the old sale's reservations are no longer its stock's. An
// unpaid order of the old sale that the closer cancels afterwards must
// not add its units to the new sale, whose stock never gave them out
// (which would leave stock 12 of an initial 10).
func TestCloseAfterANewSaleReturnsNothing(t *testing.T) {
	s := newShop(t, Options{PayTimeout: 100 * time.Millisecond})
	ctx := context.Background()
	if _, _, err := s.service.Place(ctx, user, "k-put", "widget", 2, false); err != nil {
		t.Fatal(err)
	}
	if _, err := s.products.Put(ctx, inventory.Product{SKU: "widget", Name: "Widget", Stock: 10, PriceCents: price}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	if n, err := s.service.CloseExpired(ctx, slog.Default()); n != 1 || err != nil {
		t.Fatalf("closed %d, %v", n, err)
	}
	p, err := s.products.Get(ctx, "widget")
	if err != nil {
		t.Fatal(err)
	}
	if p.Stock != p.InitialStock {
		t.Fatalf("stock %d, initial_stock %d: the closer returned units the new sale never reserved", p.Stock, p.InitialStock)
	}
}

// TestOrdersOfAnOldSaleReconcile: an admin PUT starts a new sale, yet the
// orders placed in the old one keep their status, so the order audit must
// keep seeing their reservation rows; the inventory audit, the new sale's
// stock and its sales count only the new sale's rows. Before, the PUT
// deleted the rows and every old order showed as drifted: a false alarm.
func TestOrdersOfAnOldSaleReconcile(t *testing.T) {
	s := newShop(t, Options{PayTimeout: 100 * time.Millisecond})
	ctx := context.Background()
	if _, _, err := s.service.Place(ctx, user, "k-unpaid", "widget", 2, false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.service.Place(ctx, user, "k-paid", "widget", 3, true); err != nil {
		t.Fatal(err)
	}
	if _, err := s.products.Put(ctx, inventory.Product{SKU: "widget", Name: "Widget", Stock: 10, PriceCents: price}); err != nil {
		t.Fatal(err)
	}
	s.auditOK()

	if _, _, err := s.service.Place(ctx, user, "k-new", "widget", 4, true); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond)
	if n, err := s.service.CloseExpired(ctx, slog.Default()); n != 1 || err != nil {
		t.Fatalf("closed %d, %v", n, err)
	}
	s.auditOK()
	if p, err := s.products.Get(ctx, "widget"); err != nil || p.Stock != 6 {
		t.Fatalf("stock %d, %v: want 10 of the new sale less its 4 sold", p.Stock, err)
	}
}
