package lockbench

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/testenv"
)

// The contended run: 32 goroutines, 1 ms critical section.
var contention = Contention{
	Goroutines:      32,
	CriticalSection: time.Millisecond,
	Duration:        envDuration("SHOP_BENCH_DURATION", 4*time.Second),
	GiveUp:          10 * time.Second,
}

// subject is one lock implementation under test. newAcquirer opens a
// client (as one process would) and returns how to acquire with it.
type subject struct {
	name string
	// backend is the registered backend (internal/lockkit/registry) the
	// subject measures; empty for the peers it is compared with.
	backend     string
	newAcquirer func(b *testing.B) Acquirer
	// perGoroutine gives every goroutine its own client, as if each were a
	// process of its own; otherwise all goroutines share one.
	perGoroutine bool
	// lockers, if set, opens that many clients (processes) with perLocker
	// goroutines each, in place of the contended run's goroutines: the
	// shape where waiters queue in several processes at once.
	lockers, perLocker int
	// contendedOnly marks a variant that differs from its twin only when
	// contended.
	contendedOnly bool
}

// group is the subjects that run against one server, with the raw round
// trip of that server as the baseline every ratio is taken against.
type group struct {
	name      string
	env       string
	roundTrip func(b *testing.B) func(context.Context) error
	subjects  []subject
}

// extraGroups are the other servers' groups, declared beside their imports.
var extraGroups []func() group

func groups() []group {
	gs := []group{redisGroup()}
	for _, g := range extraGroups {
		gs = append(gs, g())
	}
	return gs
}

func redisGroup() group {
	addr := os.Getenv("SHOP_TEST_REDIS_ADDR")
	newClient := func(b *testing.B) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64, ContextTimeoutEnabled: true})
		b.Cleanup(func() { _ = c.Close() })
		return c
	}
	ours := func(opts ...lockkit.Option) func(b *testing.B) Acquirer {
		return func(b *testing.B) Acquirer {
			l, err := redislock.New(newClient(b), redislock.WithPrefix("bench:"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = l.Close() })
			return lockkitAcquirer(l, opts...)
		}
	}
	return group{
		name: "redis",
		env:  "SHOP_TEST_REDIS_ADDR",
		roundTrip: func(b *testing.B) func(context.Context) error {
			c := newClient(b)
			return func(ctx context.Context) error { return c.Ping(ctx).Err() }
		},
		subjects: []subject{
			{name: "shop-redis", backend: "redis", newAcquirer: ours(lockkit.WithTTL(10 * time.Second))},
			{name: "shop-redis-per-client", backend: "redis", newAcquirer: ours(lockkit.WithTTL(10 * time.Second)), perGoroutine: true, contendedOnly: true},
			{name: "shop-redis-3-lockers-4-each", backend: "redis", newAcquirer: ours(lockkit.WithTTL(10 * time.Second)), lockers: 3, perLocker: 4, contendedOnly: true},
			{name: "shop-redis-fair", backend: "redis", newAcquirer: ours(lockkit.WithTTL(10*time.Second), lockkit.WithFair())},
			{name: "shop-redis-fair-per-client", backend: "redis", newAcquirer: ours(lockkit.WithTTL(10*time.Second), lockkit.WithFair()), perGoroutine: true, contendedOnly: true},
			{name: "redsync", newAcquirer: func(b *testing.B) Acquirer {
				rs := redsync.New(goredis.NewPool(newClient(b)))
				return func(ctx context.Context, key string) (func() error, error) {
					m := rs.NewMutex("bench:redsync:"+key, redsync.WithExpiry(10*time.Second))
					if err := m.LockContext(ctx); err != nil {
						return nil, err
					}
					return func() error { _, err := m.Unlock(); return err }, nil
				}
			}},
			{name: "bsm-redislock", newAcquirer: func(b *testing.B) Acquirer {
				client := bsm.New(newClient(b))
				retry := bsm.ExponentialBackoff(16*time.Millisecond, 512*time.Millisecond)
				return func(ctx context.Context, key string) (func() error, error) {
					lock, err := client.Obtain(ctx, "bench:bsm:"+key, 10*time.Second, &bsm.Options{RetryStrategy: retry})
					if err != nil {
						return nil, err
					}
					return func() error { return lock.Release(context.Background()) }, nil
				}
			}},
		},
	}
}

func lockkitAcquirer(l lockkit.Locker, opts ...lockkit.Option) Acquirer {
	return func(ctx context.Context, key string) (func() error, error) {
		lease, err := l.Acquire(ctx, key, opts...)
		if err != nil {
			return nil, err
		}
		return func() error { return lease.Release(context.Background()) }, nil
	}
}

// BenchmarkUncontended times acquire+release cycles on a free key, beside
// the raw round trip of the same server.
func BenchmarkUncontended(b *testing.B) {
	for _, g := range groups() {
		b.Run(g.name, func(b *testing.B) {
			testenv.Require(b, g.env)
			runs := []subject{{name: "raw-roundtrip"}}
			for _, s := range g.subjects {
				if !s.contendedOnly {
					runs = append(runs, s)
				}
			}
			for _, s := range inRoundOrder(runs) {
				b.Run(s.name, func(b *testing.B) {
					var cycle func(ctx context.Context, key string) error
					if s.newAcquirer == nil {
						rt := g.roundTrip(b)
						cycle = func(ctx context.Context, _ string) error { return rt(ctx) }
					} else {
						acquire := s.newAcquirer(b)
						cycle = func(ctx context.Context, key string) error {
							release, err := acquire(ctx, key)
							if err != nil {
								return err
							}
							return release()
						}
					}
					ctx := context.Background()
					key := fmt.Sprintf("uncontended-%d", time.Now().UnixNano())
					b.ResetTimer()
					cpu0 := processCPU()
					for b.Loop() {
						if err := cycle(ctx, key); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
					b.ReportMetric(float64(processCPU()-cpu0)/float64(b.N)/1e3, "cpu-µs/cycle")
				})
			}
		})
	}
}

// inRoundOrder is runs in this round's order: make bench reverses it
// every other round (SHOP_BENCH_ROUND even), so that no subject always
// runs right after the same other one (A B C, then C B A): what a run
// leaves behind for the next (a GC debt, a hot CPU, a server's dirty
// pages) lands on every side of the ratios.
func inRoundOrder[T any](runs []T) []T {
	if round, err := strconv.Atoi(os.Getenv("SHOP_BENCH_ROUND")); err == nil && round%2 == 0 {
		runs = slices.Clone(runs)
		slices.Reverse(runs)
	}
	return runs
}

// BenchmarkContended runs each subject once for the configured duration
// (use -benchtime=1x) and reports throughput, waits and fairness.
func BenchmarkContended(b *testing.B) {
	for _, g := range groups() {
		b.Run(g.name, func(b *testing.B) {
			testenv.Require(b, g.env)
			rt := measureRoundTrip(b, g.roundTrip(b))
			for _, s := range inRoundOrder(g.subjects) {
				b.Run(s.name, func(b *testing.B) {
					c, clients := contention, 1
					switch {
					case s.lockers > 0:
						c.Goroutines, clients = s.lockers*s.perLocker, s.lockers
					case s.perGoroutine:
						clients = c.Goroutines
					}
					acquirers := []Acquirer{s.newAcquirer(b)}
					for len(acquirers) < clients {
						acquirers = append(acquirers, s.newAcquirer(b))
					}
					key := fmt.Sprintf("contended-%d", time.Now().UnixNano())
					var r Result
					for b.Loop() {
						r = Contend(context.Background(), acquirers, key, c, rt)
					}
					b.ReportMetric(r.CyclesPerSec, "cycles/s")
					b.ReportMetric(ms(r.P50), "p50-ms")
					b.ReportMetric(ms(r.P99), "p99-ms")
					b.ReportMetric(ms(r.Max), "max-ms")
					b.ReportMetric(float64(r.GaveUp), "gaveup")
					b.ReportMetric(r.Fairness, "fairness")
					b.ReportMetric(ms(r.IdealP99), "ideal-p99-ms")
					if r.Errors > 0 {
						b.Errorf("%d errors", r.Errors)
					}
				})
			}
		})
	}
}

func measureRoundTrip(b *testing.B, rt func(context.Context) error) time.Duration {
	const n = 500
	ctx := context.Background()
	t0 := time.Now()
	for range n {
		if err := rt(ctx); err != nil {
			b.Fatal(err)
		}
	}
	return time.Since(t0) / n
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func envDuration(env string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(env)); err == nil {
		return d
	}
	return def
}
