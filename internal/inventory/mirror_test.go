package inventory

import (
	"context"
	"errors"
	"testing"

	"github.com/lockbench/shop/internal/storage"
)

// TestAMirrorLoadCannotOverwriteANewerStock: a buyer finds no mirror and
// reads the stock from the database; before it writes the mirror, an
// admin restock commits and drops the mirror. The buyer's load must not
// put the old stock back: every later buyer would be told what the
// database no longer says.
func TestAMirrorLoadCannotOverwriteANewerStock(t *testing.T) {
	ctx := context.Background()
	db := open(t, storage.Options{SQLitePath: t.TempDir() + "/inv.db"})
	m := mirror(t)
	store := NewStore(db.DB, m)
	if _, err := store.Put(ctx, Product{SKU: "m", Name: "m", Stock: 1, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	restocked := false
	m.afterRead = func(ctx context.Context) {
		if !restocked {
			restocked = true
			if _, err := store.Put(ctx, Product{SKU: "m", Name: "m", Stock: 100, PriceCents: 1}); err != nil {
				t.Error(err)
			}
		}
	}
	// The load read before the restock is refused: this sale takes
	// nothing from the mirror and is left to the database.
	if err := m.Take(ctx, "m", 1, store.Get); !errors.Is(err, errUnsettled) {
		t.Fatalf("the load that read before the restock: %v, want errUnsettled", err)
	}
	m.afterRead = nil
	for i := range 100 {
		if err := m.Take(ctx, "m", 1, store.Get); err != nil {
			t.Fatalf("take %d of the 100 restocked: %v", i+1, err)
		}
	}
}

// TestAMirrorSoldOutWhileTheDatabaseHoldsStockIsCorrected: a mirror that
// says sold out while the database holds stock (loaded stale, or short by
// units a lost commit never took) is checked against the database and
// reloaded, instead of refusing every buyer until the next change.
func TestAMirrorSoldOutWhileTheDatabaseHoldsStockIsCorrected(t *testing.T) {
	ctx := context.Background()
	db := open(t, storage.Options{SQLitePath: t.TempDir() + "/inv.db"})
	m := mirror(t)
	store := NewStore(db.DB, m)
	if _, err := store.Put(ctx, Product{SKU: "s", Name: "s", Stock: 5, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	if err := m.client.Set(ctx, m.key("s"), 0, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := m.Take(ctx, "s", 1, store.Get); err != nil {
		t.Fatalf("take with 5 units in the database and a mirror at 0: %v", err)
	}
	// Reloaded with 5 and 1 taken; the sale's SQL write is not made here.
	if drift, err := store.MirrorDrift(ctx); err != nil || drift["s"] != -1 {
		t.Fatalf("mirror drift %v (%v), want s: -1, the unit taken since the reload", drift, err)
	}
	if err := m.client.Set(ctx, m.key("s"), 2, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if drift, err := store.MirrorDrift(ctx); err != nil || drift["s"] != 2-5 {
		t.Fatalf("mirror drift %v (%v), want s: -3", drift, err)
	}
}
