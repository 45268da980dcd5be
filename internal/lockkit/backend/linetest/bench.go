package linetest

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// ContendedShapes runs Contended as each polling backend reports it: 16
// and 4 goroutines over 1 and over 3 Lockers opened by open (processes, as
// far as the store knows) on one key named after prefix, each holding it
// 1 ms, and the ceiling, one goroutine alone. Read grants/s against the
// ceiling's.
func ContendedShapes(b *testing.B, open func(b *testing.B) lockkit.Locker, prefix string) {
	for _, c := range []struct {
		name                string
		lockers, goroutines int
	}{
		{"ceiling", 1, 1},
		{"goroutines=16/lockers=1", 1, 16}, {"goroutines=16/lockers=3", 3, 16},
		{"goroutines=4/lockers=1", 1, 4}, {"goroutines=4/lockers=3", 3, 4},
	} {
		b.Run(c.name, func(b *testing.B) {
			ls := make([]lockkit.Locker, c.lockers)
			for i := range ls {
				ls[i] = open(b)
				defer ls[i].Close()
			}
			Contended(b, ls, c.goroutines, prefix+b.Name(), time.Millisecond)
		})
	}
}

// Contended runs b.N grants of key shared by goroutines spread over
// lockers, each holding the key for hold (a critical section's
// statements), and reports grants/s. After a release a goroutine works for
// hold before it asks again: a goroutine that asks again at once finds
// the key it just freed and takes it back, which hides how long a freed
// key stays idle before a waiter notices; requests of an open-loop load
// test do not come back. One goroutine on one Locker, with no pause
// between release and acquire, measures the ceiling the others are read
// against: 1 / (acquire + hold + release).
func Contended(b *testing.B, lockers []lockkit.Locker, goroutines int, key string, hold time.Duration) {
	ctx := context.Background()
	var left atomic.Int64
	left.Store(int64(b.N))
	b.ResetTimer()
	var wg sync.WaitGroup
	for g := range goroutines {
		l := lockers[g%len(lockers)]
		wg.Go(func() {
			for left.Add(-1) >= 0 {
				lease, err := l.Acquire(ctx, key, lockkit.WithTTL(time.Minute))
				if err != nil {
					b.Error(err)
					return
				}
				time.Sleep(hold)
				if err := lease.Release(ctx); err != nil {
					b.Error(err)
					return
				}
				if goroutines > 1 {
					time.Sleep(hold)
				}
			}
		})
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "grants/s")
}
