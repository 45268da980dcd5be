package zklock

import (
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/testenv"
)

// The conformance suite against a 3-member ensemble: every create and
// delete is a quorum write, each client's session lives on one member,
// chosen at random, and Steal deletes through a session of its own,
// possibly on another member than the holder's.
func TestConformanceOnEnsemble(t *testing.T) {
	addrs := testenv.RequireList(t, "SHOP_TEST_ZK_ENSEMBLE_ADDRS")
	locktest.Run(t, locktest.Harness{
		New: func(t testing.TB) lockkit.Locker { return open(t, addrs) },
		Wired: func(t testing.TB, w *locktest.Wire) lockkit.Locker {
			proxied := make([]string, len(addrs))
			for i, a := range addrs {
				proxied[i] = w.Proxy(a)
			}
			return open(t, proxied)
		},
		Steal: func(t testing.TB, key string) {
			l := open(t, addrs)
			defer l.Close()
			nodes := queue(t, l, key)
			if len(nodes) == 0 {
				t.Fatalf("no node to steal for %q", key)
			}
			if err := l.conn.Delete(nodes[0], -1); err != nil {
				t.Fatal(err)
			}
		},
		TTL:        300 * time.Millisecond,
		CrashSlack: 2 * sessionTimeout,
	})
}
