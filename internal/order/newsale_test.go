package order

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/inventory"
)

// TestCloseAfterANewSaleReturnsNothing: an admin PUT of a product starts a
// new sale and drops the old sale's purchase rows, reservations included.
// An unpaid order of the old sale that the closer cancels afterwards must
// not add its units to the new sale, whose stock never gave them out.
// (Found in review: stock 12 of an initial 10.)
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
