package redislock_test

import (
	"context"
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
