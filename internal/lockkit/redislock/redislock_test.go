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
	locktest.Run(t, harness(t, func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: addr[0]})
	}))
}

func TestConformanceCluster(t *testing.T) {
	addrs := serverAddrs(t, "SHOP_TEST_REDIS_CLUSTER_ADDRS")
	locktest.Run(t, harness(t, func() redis.UniversalClient {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	}))
}

func harness(t *testing.T, newClient func() redis.UniversalClient) locktest.Harness {
	const prefix = "redislock-test:"
	return locktest.Harness{
		// The client outlives the Locker, as the service's does: what the
		// Locker leaves behind at Close must not be hidden by the client's
		// own Close.
		New: func(tb testing.TB) lockkit.Locker {
			c := newClient()
			tb.Cleanup(func() { c.Close() })
			return redislock.New(c, redislock.WithPrefix(prefix))
		},
		Steal: func(t testing.TB, key string) {
			c := newClient()
			defer c.Close()
			if err := c.Del(context.Background(), "{"+prefix+key+"}").Err(); err != nil {
				t.Fatal(err)
			}
		},
		TTL: 300 * time.Millisecond,
	}
}

func serverAddrs(t *testing.T, env string) []string { return testenv.RequireList(t, env) }
