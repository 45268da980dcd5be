package order

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/testenv"
)

// measureOut is the file the measurements append their tables to (make
// events-bench, or a discarded file in CI).
func measureOut(t *testing.T) *os.File {
	t.Helper()
	f, err := os.OpenFile(testenv.MeasureOut(t), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// countStatements counts the SQL statements gorm sends (queries, inserts,
// updates, deletes, raw and row statements; BEGIN and COMMIT are not
// statements gorm's callbacks see).
func countStatements(t *testing.T, db *gorm.DB) *atomic.Int64 {
	t.Helper()
	var n atomic.Int64
	count := func(*gorm.DB) { n.Add(1) }
	cb := db.Callback()
	for _, err := range []error{
		cb.Create().After("gorm:create").Register("measure:count", count),
		cb.Query().After("gorm:query").Register("measure:count", count),
		cb.Update().After("gorm:update").Register("measure:count", count),
		cb.Delete().After("gorm:delete").Register("measure:count", count),
		cb.Raw().After("gorm:raw").Register("measure:count", count),
		cb.Row().After("gorm:row").Register("measure:count", count),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return &n
}

func percentile(sorted []time.Duration, p float64) time.Duration {
	return sorted[min(len(sorted)-1, int(p*float64(len(sorted))))]
}

func median(v []time.Duration) time.Duration {
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}

// TestMeasureWhatTheOutboxAddsToPlacing places orders one after another
// with and without the outbox row, in interleaved rounds (A B, then B A),
// and writes the statements per place and the medians of each round's
// p50 and p99 to SHOP_MEASURE_OUT.
func TestMeasureWhatTheOutboxAddsToPlacing(t *testing.T) {
	out := measureOut(t)
	const rounds, perRound = 9, 200
	locker := local.New()
	defer locker.Close()
	// One buyer leaves every order unpaid: no cap on its unpaid units.
	s := newShop(t, Options{Locking: guard.Locking{Locker: locker}, MaxUnpaidUnits: math.MaxInt64})
	statements := countStatements(t, s.db.DB)
	ctx := context.Background()
	if _, err := s.accounts.Put(ctx, user, math.MaxInt64/2); err != nil { // every unpaid order must fit in it
		t.Fatal(err)
	}
	if _, err := s.products.Put(ctx, inventory.Product{SKU: "measured", Name: "Measured", Stock: 1_000_000, PriceCents: price}); err != nil {
		t.Fatal(err)
	}
	type side struct {
		name       string
		without    bool
		p50, p99   []time.Duration
		statements int64
	}
	sides := []*side{{name: "with the outbox"}, {name: "without (baseline)", without: true}}
	n := 0
	for r := range rounds {
		order := []*side{sides[0], sides[1]}
		if r%2 == 1 {
			order[0], order[1] = order[1], order[0]
		}
		for _, sd := range order {
			s.orders.withoutEvents = sd.without
			lat := make([]time.Duration, 0, perRound)
			before := statements.Load()
			for range perRound {
				n++
				start := time.Now()
				if _, _, err := s.service.Place(ctx, user, fmt.Sprintf("m-%d", n), "measured", 1, false); err != nil {
					t.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			sd.statements = (statements.Load() - before) / perRound
			slices.Sort(lat)
			sd.p50, sd.p99 = append(sd.p50, percentile(lat, 0.50)), append(sd.p99, percentile(lat, 0.99))
		}
	}
	dialect := s.db.Dialect
	fmt.Fprintf(out, "## Placing an order, with and without the outbox (%s)\n\n", dialect)
	fmt.Fprintf(out, "`TestMeasureWhatTheOutboxAddsToPlacing`: one client places orders one after another (lock backend `local`, "+
		"so that only the database differs), %d interleaved rounds of %d places per side; p50 and p99 are the medians of the rounds'.\n\n", rounds, perRound)
	fmt.Fprintln(out, "| side | SQL statements per place | place p50 | place p99 |")
	fmt.Fprintln(out, "|---|---|---|---|")
	for _, sd := range sides {
		fmt.Fprintf(out, "| %s | %d | %s | %s |\n", sd.name, sd.statements,
			median(sd.p50).Round(time.Microsecond), median(sd.p99).Round(time.Microsecond))
	}
	fmt.Fprintln(out)
}
