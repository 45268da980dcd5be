package brokenrecipes

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/lockbench/shop/internal/shoptest"
)

// One user sends 8 purchases of one unit at once against a limit of 2,
// and every purchase has read the user's total before any writes it.
// Counted, then inserted, all 8 sell: 6 units over the limit. Checked and
// added in one conditional UPDATE of the user's total, as shop's sale does,
// in the same run exactly 2 sell.
func TestCountThenInsertSellsOverTheLimit(t *testing.T) {
	const buyers, limit = 8, 2
	ctx := context.Background()
	db := openSQL(t, shoptest.MySQL(t))
	counted, err := NewCountThenInsert(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	guarded, err := newConditionalLimit(ctx, db)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		// buy runs one purchase, calling decided once it has read what
		// decides the sale and before it writes.
		buy      func(sku string, decided func()) error
		wantSold int64
	}{
		{"count-then-insert", func(sku string, decided func()) error {
			c := *counted
			c.afterCount = decided
			return c.Buy(ctx, 1, sku, 1, limit)
		}, buyers},
		{"conditional-update", func(sku string, decided func()) error {
			return guarded.buy(ctx, 1, sku, 1, limit, decided)
		}, limit},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sku := "sku-" + tc.name
			// The count-then-insert buyers all stop after their count
			// until every one has counted; the conditional one decides
			// in its write, so its buyers stop before it.
			decided := barrier(buyers)
			errs := make(chan error, buyers)
			var wg sync.WaitGroup
			for range buyers {
				wg.Go(func() { errs <- tc.buy(sku, decided) })
			}
			wg.Wait()
			close(errs)
			var sold int64
			for err := range errs {
				switch {
				case err == nil:
					sold++
				case !errors.Is(err, ErrLimitExceeded):
					t.Errorf("purchase: %v", err)
				}
			}
			recorded, err := unitsBought(ctx, db, sku)
			if err != nil {
				t.Fatal(err)
			}
			if sold != tc.wantSold || recorded != sold {
				t.Fatalf("%d purchases answered sold, %d units recorded; want %d", sold, recorded, tc.wantSold)
			}
			t.Logf("limit %d per user: %d units sold to one user, %d over", limit, sold, max(0, sold-limit))
		})
	}
}

// conditionalLimit is shop's way: the user's running total in a row of its
// own, raised by one conditional UPDATE in the sale's transaction.
type conditionalLimit struct{ db *sql.DB }

func newConditionalLimit(ctx context.Context, db *sql.DB) (*conditionalLimit, error) {
	_, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS limit_totals (
		user_id BIGINT NOT NULL, sku VARCHAR(64) NOT NULL, units BIGINT NOT NULL,
		PRIMARY KEY (user_id, sku)) ENGINE = InnoDB`)
	return &conditionalLimit{db: db}, err
}

func (c *conditionalLimit) buy(ctx context.Context, user int64, sku string, quantity, limit int64, decided func()) error {
	decided()
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "INSERT INTO limit_totals (user_id, sku, units) VALUES (?, ?, 0) ON DUPLICATE KEY UPDATE units = units",
		user, sku); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, "UPDATE limit_totals SET units = units + ? WHERE user_id = ? AND sku = ? AND units + ? <= ?",
		quantity, user, sku, quantity, limit)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return errors.Join(fmt.Errorf("%w: at most %d", ErrLimitExceeded, limit), err)
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO brokenrecipes_purchases (user_id, sku, quantity) VALUES (?, ?, ?)",
		user, sku, quantity); err != nil {
		return err
	}
	return tx.Commit()
}

func unitsBought(ctx context.Context, db *sql.DB, sku string) (int64, error) {
	var units int64
	err := db.QueryRowContext(ctx, "SELECT COALESCE(SUM(quantity), 0) FROM brokenrecipes_purchases WHERE user_id = 1 AND sku = ?", sku).Scan(&units)
	return units, err
}

// barrier holds the first n callers until all n have come; later callers
// pass at once.
func barrier(n int) func() {
	var mu sync.Mutex
	all := make(chan struct{})
	came := 0
	return func() {
		mu.Lock()
		came++
		if came == n {
			close(all)
		}
		mu.Unlock()
		<-all
	}
}
