package lockbench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit/locktest"
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
	ctx := context.Background()
	for _, s := range RedisSubjects() {
		b.Run(s.Name, func(b *testing.B) {
			w := locktest.NewWire(b)
			c := redis.NewClient(&redis.Options{Addr: addr, Dialer: w.DialContext, ContextTimeoutEnabled: true})
			b.Cleanup(func() { _ = c.Close() })
			cycle, closer, err := s.Open(c)
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { _ = closer() })
			run := func(n int) {
				for i := range n {
					if err := cycle(ctx, fmt.Sprintf("k%d", i%16)); err != nil {
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
