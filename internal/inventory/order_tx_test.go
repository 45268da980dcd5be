package inventory

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/shoptest"
)

// oneInsertReadsTheSale wants statements to hold one purchase INSERT and
// no other statement that names the sale.
func oneInsertReadsTheSale(t *testing.T, statements []string) {
	t.Helper()
	var inserts int
	for _, sql := range statements {
		switch {
		case strings.HasPrefix(sql, "INSERT INTO `purchases`"):
			inserts++
		case strings.Contains(sql, "sale"):
			t.Errorf("a statement of its own reads the sale: %s", sql)
		}
	}
	if inserts != 1 {
		t.Errorf("%d purchase inserts, want 1 in %q", inserts, statements)
	}
}

// TestTheReservationsSaleCostsNoStatement: an order's reservation reads
// the product's sale inside its purchase row's INSERT, never in a
// statement of its own: the order flows pay every round trip inside their
// transaction, under the locks of the rows they hold. The row still goes
// through gorm's Create (the order tests hook its callbacks), lands in the
// current sale, and hands back its id.
func TestTheReservationsSaleCostsNoStatement(t *testing.T) {
	for dbName, newDB := range databases(t) {
		for _, tc := range []struct {
			name  string
			fence uint64
			limit int64
		}{{"unfenced", 0, 0}, {"fenced", 7, 0}, {"limited", 0, 5}} {
			t.Run(fmt.Sprintf("%s/%s", dbName, tc.name), func(t *testing.T) {
				ctx := context.Background()
				db := newDB(t)
				log := shoptest.NewStatementLog()
				traced := db.DB.Session(&gorm.Session{Logger: log})
				store := NewStore(traced, nil)
				for range 2 { // the second put starts sale 1
					if _, err := store.Put(ctx, Product{SKU: "w", Name: "w", Stock: 10, PriceCents: 1, PerUserLimit: tc.limit}); err != nil {
						t.Fatal(err)
					}
				}
				if err := store.Claim(ctx, "w", tc.fence); err != nil {
					t.Fatal(err)
				}
				log.Take()
				p := Purchase{SKU: "w", UserID: 3, Quantity: 2, OrderID: 11}
				if err := traced.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
					return Reserve(tx, &p, tc.fence)
				}); err != nil {
					t.Fatal(err)
				}
				oneInsertReadsTheSale(t, log.Take())
				var rows []Purchase
				if err := db.DB.Where("order_id = ?", p.OrderID).Find(&rows).Error; err != nil {
					t.Fatal(err)
				}
				want := Purchase{ID: p.ID, SKU: "w", UserID: 3, Quantity: 2, Strategy: StrategyOrder, Fence: tc.fence, OrderID: 11, Sale: 1}
				if len(rows) != 1 || p.ID == 0 {
					t.Fatalf("rows %+v, reservation id %d: want one row with its id handed back", rows, p.ID)
				}
				got := rows[0]
				got.CreatedAt = time.Time{}
				if got != want {
					t.Errorf("row %+v, want %+v", got, want)
				}
				if prod, err := store.Get(ctx, "w"); err != nil || prod.Stock != 8 {
					t.Errorf("stock %d (%v), want 8", prod.Stock, err)
				}
			})
		}
	}
}
