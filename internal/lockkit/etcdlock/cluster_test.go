package etcdlock

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/testenv"
)

// The conformance suite against a 3-member cluster: every grant is a
// quorum write, and the client spreads its calls over the members. Steal
// deletes through a client of its own, whose calls may reach another
// member than the holder's.
func TestConformanceOnCluster(t *testing.T) {
	endpoints := testenv.RequireList(t, "SHOP_TEST_ETCD_CLUSTER_ENDPOINTS")
	locktest.Run(t, locktest.Harness{
		New: func(t testing.TB) lockkit.Locker { return open(t, endpoints) },
		Wired: func(t testing.TB, w *locktest.Wire) lockkit.Locker {
			proxied := make([]string, len(endpoints))
			for i, e := range endpoints {
				proxied[i] = w.Proxy(e)
			}
			return open(t, proxied)
		},
		Steal: func(t testing.TB, key string) {
			c := dial(t, endpoints)
			ctx := context.Background()
			resp, err := c.Get(ctx, dir(key), clientv3.WithFirstCreate()...)
			if err != nil || len(resp.Kvs) == 0 {
				t.Fatalf("no key to steal for %q: %v", key, err)
			}
			if _, err := c.Delete(ctx, string(resp.Kvs[0].Key)); err != nil {
				t.Fatal(err)
			}
		},
		TTL:        300 * time.Millisecond,
		CrashSlack: sessionTTL,
	})
}
