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

// The contended run: waiters loop acquire / 1 ms critical section /
// release on one key, in each shape.
// warmUp is the unmeasured run of contend before the measured one.
const warmUp = 300 * time.Millisecond

var contention = Contention{
	CriticalSection: time.Millisecond,
	Duration:        envDuration("SHOP_BENCH_DURATION", 4*time.Second),
	GiveUp:          10 * time.Second,
}

// shape is how a contended run's waiters are spread over processes: each
// process is a client of its own (a Locker with its own connections), its
// waiters share it, as the goroutines of one service replica do.
type shape struct {
	name                  string
	processes, perProcess int
}

// shapes are the ones replicas make, the multi-process ones first: many
// replicas with one waiter each, a few with a few each, one with many.
var shapes = []shape{{"32x1", 32, 1}, {"3x4", 3, 4}, {"1x32", 1, 32}}

// subject is one lock implementation under test.
type subject struct {
	name string
	// backend is the registered backend (internal/lockkit/registry) the
	// subject measures; empty for the peers it is compared with.
	backend string
	// open opens one process's client and returns how each of its
	// waiters acquires.
	open func(b *testing.B) newWaiter
	// raw, set for the baselines in place of open, is one bare call to
	// the server.
	raw func(b *testing.B) func(context.Context) error
}

// newWaiter returns the Acquirer of one more waiter of a process: the
// process's own for most libraries, a session of its own where the library
// requires one per waiter.
type newWaiter func(b *testing.B) Acquirer

// shared is a subject whose waiters all use the one Acquirer of their
// process.
func shared(open func(b *testing.B) Acquirer) func(b *testing.B) newWaiter {
	return func(b *testing.B) newWaiter {
		a := open(b)
		return func(*testing.B) Acquirer { return a }
	}
}

// group is the subjects that run against one server, with the raw round
// trip of that server as the baseline every ratio is taken against.
type group struct {
	name      string
	env       string
	roundTrip func(b *testing.B) func(context.Context) error
	// writeRoundTrip, if set, is one durable write: what a release costs
	// at least before a waiter in another process can learn of it.
	writeRoundTrip func(b *testing.B) func(context.Context) error
	subjects       []subject
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
			{name: "shop-redis", backend: "redis", open: shared(ours(lockkit.WithTTL(10 * time.Second)))},
			{name: "redsync", open: shared(func(b *testing.B) Acquirer {
				return redsyncAcquirer(newClient(b))
			})},
			{name: "bsm-redislock", open: shared(func(b *testing.B) Acquirer {
				client := bsm.New(newClient(b))
				retry := bsm.ExponentialBackoff(16*time.Millisecond, 512*time.Millisecond)
				return func(ctx context.Context, key string) (func() error, error) {
					lock, err := client.Obtain(ctx, "bench:bsm:"+key, 10*time.Second, &bsm.Options{RetryStrategy: retry})
					if err != nil {
						return nil, err
					}
					return func() error { return lock.Release(context.Background()) }, nil
				}
			})},
		},
	}
}

// redsyncAcquirer is redsync's mutex on one Redis client (a node or a
// Cluster), as the peer of shop-redis.
func redsyncAcquirer(c redis.UniversalClient) Acquirer {
	rs := redsync.New(goredis.NewPool(c))
	return func(ctx context.Context, key string) (func() error, error) {
		m := rs.NewMutex("bench:redsync:"+key, redsync.WithExpiry(10*time.Second))
		if err := m.LockContext(ctx); err != nil {
			return nil, err
		}
		return func() error { _, err := m.Unlock(); return err }, nil
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
			runs := []subject{{name: "raw-roundtrip", raw: g.roundTrip}}
			if g.writeRoundTrip != nil {
				runs = append(runs, subject{name: "raw-write", raw: g.writeRoundTrip})
			}
			runs = append(runs, g.subjects...)
			for _, s := range inRoundOrder(runs) {
				b.Run(s.name, func(b *testing.B) {
					var cycle func(ctx context.Context, key string) error
					if s.raw != nil {
						rt := s.raw(b)
						cycle = func(ctx context.Context, _ string) error { return rt(ctx) }
					} else {
						acquire := s.open(b)(b)
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

// BenchmarkContended runs each subject once in each shape for the
// configured duration (use -benchtime=1x) and reports throughput, waits and
// fairness.
func BenchmarkContended(b *testing.B) {
	for _, g := range groups() {
		b.Run(g.name, func(b *testing.B) {
			testenv.Require(b, g.env)
			rt := measureRoundTrip(b, g.roundTrip(b))
			for _, sh := range shapes {
				b.Run(sh.name, func(b *testing.B) {
					for _, s := range inRoundOrder(g.subjects) {
						b.Run(s.name, func(b *testing.B) { contend(b, s, sh, rt) })
					}
				})
			}
		})
	}
}

// contend runs s in shape sh and reports what Contend measured.
func contend(b *testing.B, s subject, sh shape, rt time.Duration) {
	var acquirers []Acquirer
	for range sh.processes {
		waiter := s.open(b)
		for range sh.perProcess {
			acquirers = append(acquirers, waiter(b))
		}
	}
	c := contention
	c.Goroutines = len(acquirers)
	key := fmt.Sprintf("contended-%d", time.Now().UnixNano())
	// A process's first wait dials its connections and subscribes (a
	// Cluster client loads the slot map first): a cost per process, not
	// per hand-off, so a short run on another key takes it out of the
	// measured one.
	warm := c
	warm.Duration = warmUp
	Contend(context.Background(), acquirers, key+"-warm-up", warm, rt)
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
	b.ReportMetric(float64(c.Goroutines), "waiters")
	b.ReportMetric(us(r.HandOffP50), "handoff-p50-µs")
	b.ReportMetric(us(r.HandOffP99), "handoff-p99-µs")
	if r.Errors > 0 {
		b.Errorf("%d errors", r.Errors)
	}
}

// measureRoundTrip is the median of n calls: the first dials, and a
// mean would carry it.
func measureRoundTrip(b *testing.B, rt func(context.Context) error) time.Duration {
	const n = 500
	ctx := context.Background()
	calls := make([]time.Duration, n)
	for i := range calls {
		t0 := time.Now()
		if err := rt(ctx); err != nil {
			b.Fatal(err)
		}
		calls[i] = time.Since(t0)
	}
	slices.Sort(calls)
	return Percentile(calls, 0.50)
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func envDuration(env string, def time.Duration) time.Duration {
	if d, err := time.ParseDuration(os.Getenv(env)); err == nil {
		return d
	}
	return def
}
