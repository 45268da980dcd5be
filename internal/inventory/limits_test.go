package inventory

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/lockbench/shop/internal/audit"
)

// TestAuditSeesUnitsBoughtOverTheLimit: a user holds 3 units of a SKU
// whose limit is 1, and the per-user total says 0 (laid down by hand, the
// stock moved to match, so the stock checks see nothing). The audit must
// count the 2 units over the limit and the 3 the total missed.
func TestAuditSeesUnitsBoughtOverTheLimit(t *testing.T) {
	for dbName, newDB := range databases(t) {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			db := newDB(t)
			s := NewStore(db.DB, nil)
			if _, err := s.Put(ctx, Product{SKU: "lim", Name: "lim", Stock: 10, PriceCents: 1, PerUserLimit: 1}); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				p := Purchase{SKU: "lim", UserID: 7, Quantity: 1, Strategy: StrategyAtomicSQL}
				if err := db.DB.Create(&p).Error; err != nil {
					t.Fatal(err)
				}
			}
			if err := db.DB.Create(&PurchaseLimit{UserID: 7, SKU: "lim", Units: 0}).Error; err != nil {
				t.Fatal(err)
			}
			if err := db.DB.Exec("UPDATE products SET stock = stock - 3 WHERE sku = 'lim'").Error; err != nil {
				t.Fatal(err)
			}
			r, err := audit.New((&Domain{Store: s}).Checks(), nil).Audit(ctx)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := json.Marshal(r)
			if r.OK {
				t.Fatalf("the audit says ok: %s", b)
			}
			for name, want := range map[string]int64{"stock_drift": 0, "oversold_units": 0, "over_limit_units": 2, "miscounted_limit_units": 3} {
				if got := r.Drifts[name].Total; got != want {
					t.Errorf("%s %d, want %d: %s", name, got, want, b)
				}
			}
		})
	}
}
