package brokenrecipes

import (
	"context"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// Two waiters read the same stale expiry and both go on to recover the
// lock. Recovered with DEL + SETNX, both win: the second's DEL deletes the
// first one's fresh lock. Recovered with GETSET, in the same interleaving,
// only the first does.
func TestDelSetNXRecoveryLetsTwoWaitersWin(t *testing.T) {
	ctx := context.Background()
	rdb := dial(t)
	for _, tc := range []struct {
		name        string
		open        func() *stamped
		wantWinners int
	}{
		{"del-setnx", func() *stamped { return &NewDelSetNX(rdb).stamped }, 2},
		{"getset", func() *stamped { return &NewGetSetTimestamp(rdb).stamped }, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := testKey(t, rdb)
			clock := fakeClock(time.Now())
			w1, w2 := tc.open(), tc.open()
			for _, w := range []*stamped{w1, w2} {
				w.now = clock.now
				defer w.Close()
			}
			// A crashed holder's lock, long stale.
			if err := rdb.Set(ctx, key, clock.now().Add(-time.Minute).UnixMilli(), 0).Err(); err != nil {
				t.Fatal(err)
			}

			// Both waiters stop between their GET and their recovery, so
			// both have read the stale value before either recovers.
			read1, go1 := make(chan struct{}), make(chan struct{})
			read2, go2 := make(chan struct{}), make(chan struct{})
			w1.afterGet = func() { close(read1); <-go1 }
			w2.afterGet = func() { close(read2); <-go2 }
			results := make(chan error, 2)
			var leases [2]lockkit.Lease
			for i, w := range []*stamped{w1, w2} {
				go func() {
					l, err := w.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
					leases[i] = l
					results <- err
				}()
			}
			<-read1
			<-read2
			close(go1)
			first := <-results
			close(go2)
			second := <-results

			winners := 0
			for _, err := range []error{first, second} {
				if err == nil {
					winners++
				}
			}
			for _, l := range leases {
				if l != nil {
					defer l.Release(ctx)
				}
			}
			if winners != tc.wantWinners {
				t.Fatalf("%d waiters got the lock (first %v, second %v), want %d", winners, first, second, tc.wantWinners)
			}
			t.Logf("%d of 2 waiters hold the key", winners)
		})
	}
}
