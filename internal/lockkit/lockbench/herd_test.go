package lockbench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockbench/shop/internal/lockkit/brokenrecipes"
	"github.com/lockbench/shop/internal/lockkit/zklock"
	"github.com/lockbench/shop/internal/testenv"
)

// herdRecipe opens one ZooKeeper client through addr, as one process
// would, and returns how it acquires.
type herdRecipe struct {
	name string
	open func(b *testing.B, addr string) Acquirer
}

func herdRecipes() []herdRecipe {
	connect := func(b *testing.B, addr string) *zk.Conn {
		c, _, err := zk.Connect([]string{addr}, 10*time.Second, zk.WithLogInfo(false))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		return c
	}
	return []herdRecipe{
		{"parent-watch", func(b *testing.B, addr string) Acquirer {
			l := brokenrecipes.NewParentWatch(connect(b, addr), "/bench/herd/parent")
			return lockkitAcquirer(closeWith(b, l, nil), long)
		}},
		{"go-zookeeper-zk.Lock", func(b *testing.B, addr string) Acquirer {
			c := connect(b, addr)
			return func(_ context.Context, key string) (func() error, error) {
				lock := zk.NewLock(c, "/bench/herd/peer/"+key, zk.WorldACL(zk.PermAll))
				if err := lock.Lock(); err != nil {
					return nil, err
				}
				return lock.Unlock, nil
			}
		}},
		{"shop-zookeeper", func(b *testing.B, addr string) Acquirer {
			l, err := zklock.New([]string{addr}, 10*time.Second, zklock.WithRoot("/bench/herd/shop"))
			return lockkitAcquirer(closeWith(b, l, err), long)
		}},
	}
}

// herdQuiet is how long the wire must be silent, with every request
// answered, before the next step: far above the time a client takes to
// answer a notification, so that no wake-up of one step is counted in the
// next, nor two changes served by one listing.
const herdQuiet = 50 * time.Millisecond

// BenchmarkHerd counts what one release costs ZooKeeper with 1, 8 and 32
// waiters, each a client of its own: the recipe that watches the lock's
// directory (every waiter wakes on every change) beside the ones that
// watch the node just ahead. A release is the steady state of a contended
// key: the holder deletes its node, the next waiter is granted, and the
// old holder queues again at the back. Each step runs once the wire has
// settled, so the counts are exact, not timings; run with -benchtime=1x.
func BenchmarkHerd(b *testing.B) {
	testenv.Require(b, "SHOP_TEST_ZK_ADDRS")
	server := strings.Split(os.Getenv("SHOP_TEST_ZK_ADDRS"), ",")[0]
	for _, r := range herdRecipes() {
		b.Run(r.name, func(b *testing.B) {
			for _, waiters := range []int{1, 8, 32} {
				b.Run(fmt.Sprintf("waiters-%d", waiters), func(b *testing.B) {
					var requests, wakeUps float64
					for b.Loop() {
						requests, wakeUps = countHerd(b, r, server, waiters)
					}
					b.ReportMetric(requests, "requests/release")
					b.ReportMetric(wakeUps, "wakeups/release")
				})
			}
		})
	}
}

// countHerd queues waiters behind a holder, each on a client of its own,
// and returns the requests the clients sent and the watch notifications
// they received per release, over releases releases.
func countHerd(b *testing.B, r herdRecipe, server string, waiters int) (requests, wakeUps float64) {
	const releases = 10
	z := newZKCounter(b, server)
	key := fmt.Sprintf("herd-%d", time.Now().UnixNano())
	type grant struct {
		client  int
		release func() error
	}
	granted := make(chan grant)
	clients := make([]Acquirer, waiters+1)
	for i := range clients {
		clients[i] = r.open(b, z.addr)
	}
	queue := func(i int) {
		sent := z.requests.Load()
		go func() {
			release, err := clients[i](context.Background(), key)
			if err != nil {
				b.Error(err)
				release = func() error { return nil }
			}
			granted <- grant{i, release}
		}()
		z.settle(sent, herdQuiet)
	}
	queue(0)
	holder := <-granted
	for i := 1; i <= waiters; i++ {
		queue(i)
	}
	requests0, notifications0 := z.requests.Load(), z.notifications.Load()
	for range releases {
		sent := z.requests.Load()
		if err := holder.release(); err != nil {
			b.Fatal(err)
		}
		next := <-granted
		z.settle(sent, herdQuiet)
		queue(holder.client)
		holder = next
	}
	requests = float64(z.requests.Load()-requests0) / releases
	wakeUps = float64(z.notifications.Load()-notifications0) / releases
	for range waiters { // let every queued client through, so none is left waiting
		_ = holder.release()
		holder = <-granted
	}
	_ = holder.release()
	return requests, wakeUps
}
