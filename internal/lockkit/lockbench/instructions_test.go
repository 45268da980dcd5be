package lockbench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

// BenchmarkRedisInstructions runs uncontended acquire + release cycles of
// one Redis subject against a private redis-server that
// scripts/redis-instructions.sh runs under callgrind
// (SHOP_BENCH_CALLGRIND_ADDR, its valgrind's pid in
// SHOP_BENCH_CALLGRIND_PID). Around the b.N cycles it zeroes and dumps the
// server's counters, then idles for the same wall time and dumps again, so
// that the script can subtract the server's timer. It reports the calls
// each cycle sent (counted on the wire: without pipelining, round trips)
// and the client's allocations.
func BenchmarkRedisInstructions(b *testing.B) {
	addr, pid := os.Getenv("SHOP_BENCH_CALLGRIND_ADDR"), os.Getenv("SHOP_BENCH_CALLGRIND_PID")
	if addr == "" || pid == "" {
		b.Skip("run by scripts/redis-instructions.sh, which starts the server under callgrind")
	}
	for _, s := range instructionSubjects() {
		b.Run(s.name, func(b *testing.B) {
			w := locktest.NewWire(b)
			c := redis.NewClient(&redis.Options{Addr: addr, Dialer: w.DialContext, ContextTimeoutEnabled: true})
			b.Cleanup(func() { _ = c.Close() })
			cycle := s.open(b, c)
			run := func(n int) {
				for i := range n {
					if err := cycle(fmt.Sprintf("k%d", i%16)); err != nil {
						b.Fatal(err)
					}
				}
			}
			run(200) // scripts loaded, connections open
			callgrind(b, "-z", pid)
			calls := w.Calls()
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			run(b.N)
			took := time.Since(start)
			b.StopTimer()
			callgrind(b, "-d", pid)
			b.ReportMetric(float64(w.Calls()-calls)/float64(b.N), "calls/op")
			callgrind(b, "-z", pid)
			time.Sleep(took)
			callgrind(b, "-d", pid)
		})
	}
}

func callgrind(b *testing.B, arg, pid string) {
	if out, err := exec.Command("callgrind_control", arg, pid).CombinedOutput(); err != nil {
		b.Fatalf("callgrind_control %s: %v: %s", arg, err, out)
	}
}

type instructionSubject struct {
	name string
	open func(b *testing.B, c *redis.Client) func(key string) error
}

func instructionSubjects() []instructionSubject {
	ctx := context.Background()
	shop := func(opts ...lockkit.Option) func(b *testing.B, c *redis.Client) func(string) error {
		return func(b *testing.B, c *redis.Client) func(string) error {
			l, err := redislock.New(c, redislock.WithPrefix("instr:"))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = l.Close() })
			o := append([]lockkit.Option{lockkit.WithTTL(10 * time.Second)}, opts...)
			return func(key string) error {
				lease, err := l.Acquire(ctx, key, o...)
				if err != nil {
					return err
				}
				return lease.Release(ctx)
			}
		}
	}
	return []instructionSubject{
		{"shop-redis", shop()},
		{"shop-redis-unfenced", shop(lockkit.WithoutFence())},
		{"bsm-redislock", func(b *testing.B, c *redis.Client) func(string) error {
			client := bsm.New(c)
			return func(key string) error {
				lock, err := client.Obtain(ctx, "instr:bsm:"+key, 10*time.Second, nil)
				if err != nil {
					return err
				}
				return lock.Release(ctx)
			}
		}},
		{"redsync", func(b *testing.B, c *redis.Client) func(string) error {
			rs := redsync.New(goredis.NewPool(c))
			return func(key string) error {
				m := rs.NewMutex("instr:redsync:"+key, redsync.WithExpiry(10*time.Second))
				if err := m.LockContext(ctx); err != nil {
					return err
				}
				_, err := m.UnlockContext(ctx)
				return err
			}
		}},
	}
}
