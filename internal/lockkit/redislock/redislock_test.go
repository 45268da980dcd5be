package redislock_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/testenv"
)

func TestConformanceSingleNode(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")
	locktest.Run(t, harness(t, func(w *locktest.Wire) redis.UniversalClient {
		o := &redis.Options{Addr: addr[0], ContextTimeoutEnabled: true}
		if w != nil {
			o.Dialer = w.DialContext
		}
		return redis.NewClient(o)
	}))
}

func TestConformanceCluster(t *testing.T) {
	addrs := serverAddrs(t, "SHOP_TEST_REDIS_CLUSTER_ADDRS")
	locktest.Run(t, harness(t, func(w *locktest.Wire) redis.UniversalClient {
		o := &redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true}
		if w != nil {
			o.Dialer = w.DialContext
		}
		return redis.NewClusterClient(o)
	}))
}

// harness opens one client per Locker, through w when w is not nil. The
// client outlives its Locker until the test ends, as a process's shared
// client does, so that what the Locker leaves behind on it shows up.
func harness(t *testing.T, newClient func(w *locktest.Wire) redis.UniversalClient) locktest.Harness {
	const prefix = "redislock-test:"
	open := func(t testing.TB, w *locktest.Wire) lockkit.Locker {
		c := newClient(w)
		t.Cleanup(func() { _ = c.Close() })
		l, err := redislock.New(c, redislock.WithPrefix(prefix))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	return locktest.Harness{
		New:   func(t testing.TB) lockkit.Locker { return open(t, nil) },
		Wired: open,
		Steal: func(t testing.TB, key string) {
			c := newClient(nil)
			defer c.Close()
			if err := c.Del(context.Background(), "{"+prefix+key+"}").Err(); err != nil {
				t.Fatal(err)
			}
		},
		TTL: 300 * time.Millisecond,
	}
}

func serverAddrs(t *testing.T, env string) []string { return testenv.RequireList(t, env) }

// TestCloseWaitsForRenewalInFlight: Close promises that nothing of the
// Locker uses the client once it returns, so that the caller may close the
// client next. A watchdog renewal sent just before Close, against a Redis
// that has stopped answering, must not still be running afterwards.
func TestCloseWaitsForRenewalInFlight(t *testing.T) {
	p := newProxy(t, serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0])
	l, err := redislock.New(newClient(t, p.addr), redislock.WithPrefix(testPrefix))
	if err != nil {
		t.Fatal(err)
	}
	const ttl = 900 * time.Millisecond
	lease, err := l.TryAcquire(context.Background(), uniqueKey(t), lockkit.WithAutoRenew(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	p.blackhole(true)
	defer p.blackhole(false)
	time.Sleep(ttl/3 + 100*time.Millisecond) // the first renewal is on the wire
	if !renewing() {
		t.Fatal("no renewal in flight; the test did not set up what it means to")
	}
	_ = l.Close()
	if renewing() {
		t.Fatal("Close returned while a renewal still uses the client")
	}
}

// renewing reports whether a watchdog renewal is inside a call on the
// client.
func renewing() bool {
	buf := make([]byte, 1<<20)
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "lockkit/backend.(*lease).renew") && strings.Contains(g, "redis/go-redis") {
			return true
		}
	}
	return false
}
