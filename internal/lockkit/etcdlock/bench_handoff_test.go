package etcdlock

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/lockbench"
)

// BenchmarkContendedHandOff runs 16 goroutines on one key with a 1 ms
// critical section, spread over one Locker or three (each with a client
// of its own, as three processes would). Use -benchtime=1x;
// SHOP_BENCH_DURATION sets the length of a run (3 s).
func BenchmarkContendedHandOff(b *testing.B) {
	endpoints := serverEndpoints(b)
	duration := 3 * time.Second
	if d, err := time.ParseDuration(os.Getenv("SHOP_BENCH_DURATION")); err == nil {
		duration = d
	}
	for _, lockers := range []int{1, 3} {
		b.Run(fmt.Sprintf("lockers=%d", lockers), func(b *testing.B) {
			var acquirers []lockbench.Acquirer
			for range lockers {
				l := open(b, endpoints)
				acquirers = append(acquirers, func(ctx context.Context, key string) (func() error, error) {
					lease, err := l.Acquire(ctx, key, lockkit.WithTTL(10*time.Second))
					if err != nil {
						return nil, err
					}
					return func() error { return lease.Release(context.Background()) }, nil
				})
			}
			c := lockbench.Contention{Goroutines: 16, CriticalSection: time.Millisecond, Duration: duration, GiveUp: 10 * time.Second}
			key := "bench-" + rand.Text()
			var r lockbench.Result
			for b.Loop() {
				r = lockbench.Contend(context.Background(), acquirers, key, c, 0)
			}
			b.ReportMetric(r.CyclesPerSec, "cycles/s")
			b.ReportMetric(float64(r.P50)/1e6, "p50-ms")
			b.ReportMetric(float64(r.P99)/1e6, "p99-ms")
			b.ReportMetric(r.Fairness, "fairness")
			if r.Errors > 0 {
				b.Errorf("%d errors", r.Errors)
			}
		})
	}
}
