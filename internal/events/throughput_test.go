package events

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/testenv"
)

// TestMeasureRelayThroughput fills the outbox with events of distinct
// orders and times the relay draining it to a real nats-server, in
// rounds, and appends events per second (median and range) to
// SHOP_MEASURE_OUT (make events-bench).
func TestMeasureRelayThroughput(t *testing.T) {
	path := testenv.MeasureOut(t)
	const rounds, perRound = 5, 5000
	b := connect(t, testenv.Require(t, testenv.NATSURLVar))
	b.stream.DuplicateWindow = 10 * time.Minute
	db := openDB(t)
	relay := newRelay(db, b, nil, nil)
	relay.o.Batch = DefaultRelayBatch
	ctx := context.Background()
	var rates []float64
	for r := range rounds {
		fill(t, db, int64(r*perRound+1), perRound)
		start := time.Now()
		for {
			n, err := relay.Round(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				break
			}
		}
		rates = append(rates, perRound/time.Since(start).Seconds())
	}
	slices.Sort(rates)
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dialect := db.Dialector.Name()
	fmt.Fprintf(f, "## Events per second through the relay (%s, one nats-server)\n\n", dialect)
	fmt.Fprintf(f, "`TestMeasureRelayThroughput`: %d rounds, each filling the outbox with %d events of distinct orders and timing one relay "+
		"draining it (batches of %d published asynchronously, their acks awaited, then one mark per batch) to the testenv nats-server "+
		"(file store, 1 replica).\n\n", rounds, perRound, DefaultRelayBatch)
	fmt.Fprintln(f, "| events/s median | min | max |")
	fmt.Fprintln(f, "|---|---|---|")
	fmt.Fprintf(f, "| %.0f | %.0f | %.0f |\n\n", rates[len(rates)/2], rates[0], rates[len(rates)-1])
}

// fill writes n placed events of orders first..first+n-1, 500 to a
// transaction.
func fill(t *testing.T, db *gorm.DB, first int64, n int) {
	t.Helper()
	for i := 0; i < n; i += 500 {
		err := db.Transaction(func(tx *gorm.DB) error {
			for id := first + int64(i); id < first+int64(min(i+500, n)); id++ {
				e := Event{ID: ID(id, TypeOrderPlaced), Type: TypeOrderPlaced, OrderID: id, UserID: 7, SKU: "widget",
					Quantity: 1, AmountCents: 1250, OccurredAt: time.Now().UTC()}
				if err := Append(context.Background(), tx, e); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}
