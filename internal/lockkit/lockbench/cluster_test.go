package lockbench

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockbench/shop/internal/lockkit/etcdlock"
	"github.com/lockbench/shop/internal/lockkit/zklock"
	"github.com/lockbench/shop/internal/testenv"
)

// clusterTarget is a 3-member etcd cluster or ZooKeeper ensemble, measured
// beside the standalone server of the same kind: every grant and release
// there is a quorum write (the leader waits for one follower's fsync
// before it answers).
type clusterTarget struct {
	name, env string
	roundTrip func(b *testing.B, addrs []string) func(context.Context) error
	ours      func(b *testing.B, addrs []string) Acquirer
}

var clusterTargets = []clusterTarget{
	{
		name: "etcd-3-members", env: "SHOP_TEST_ETCD_CLUSTER_ENDPOINTS",
		roundTrip: func(b *testing.B, addrs []string) func(context.Context) error {
			c := etcdClient(b, addrs)
			return func(ctx context.Context) error { _, err := c.Get(ctx, "/bench/ping"); return err }
		},
		ours: func(b *testing.B, addrs []string) Acquirer {
			l, err := etcdlock.FromClient(etcdClient(b, addrs), etcdlock.WithPrefix("/bench/shop/"))
			return lockkitAcquirer(closeWith(b, l, err), long)
		},
	},
	{
		name: "zookeeper-3-members", env: "SHOP_TEST_ZK_ENSEMBLE_ADDRS",
		roundTrip: func(b *testing.B, addrs []string) func(context.Context) error {
			c, _, err := zk.Connect(addrs, 10*time.Second, zk.WithLogInfo(false))
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(c.Close)
			return func(context.Context) error { _, _, err := c.Exists("/"); return err }
		},
		ours: func(b *testing.B, addrs []string) Acquirer {
			l, err := zklock.New(addrs, 10*time.Second, zklock.WithRoot("/bench/shop"))
			return lockkitAcquirer(closeWith(b, l, err), long)
		},
	},
}

func etcdClient(b *testing.B, endpoints []string) *clientv3.Client {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = c.Close() })
	return c
}

// BenchmarkUncontendedCluster is BenchmarkUncontended on the clusters:
// acquire+release cycles on a free key, beside a read's round trip.
func BenchmarkUncontendedCluster(b *testing.B) {
	for _, ct := range clusterTargets {
		b.Run(ct.name, func(b *testing.B) {
			addrs := strings.Split(testenv.Require(b, ct.env), ",")
			b.Run("raw-roundtrip", func(b *testing.B) {
				rt := ct.roundTrip(b, addrs)
				cycles(b, func(ctx context.Context, _ string) error { return rt(ctx) })
			})
			b.Run("shop-"+strings.TrimSuffix(ct.name, "-3-members"), func(b *testing.B) {
				acquire := ct.ours(b, addrs)
				cycles(b, func(ctx context.Context, key string) error {
					release, err := acquire(ctx, key)
					if err != nil {
						return err
					}
					return release()
				})
			})
		})
	}
}

func cycles(b *testing.B, cycle func(ctx context.Context, key string) error) {
	ctx := context.Background()
	key := fmt.Sprintf("uncontended-%d", time.Now().UnixNano())
	for b.Loop() {
		if err := cycle(ctx, key); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
}

// BenchmarkContendedCluster is BenchmarkContended on the clusters (use
// -benchtime=1x): 32 goroutines on one client, one key.
func BenchmarkContendedCluster(b *testing.B) {
	for _, ct := range clusterTargets {
		b.Run(ct.name, func(b *testing.B) {
			addrs := strings.Split(testenv.Require(b, ct.env), ",")
			rt := measureRoundTrip(b, ct.roundTrip(b, addrs))
			b.Run("shop-"+strings.TrimSuffix(ct.name, "-3-members"), func(b *testing.B) {
				acquirers := []Acquirer{ct.ours(b, addrs)}
				key := fmt.Sprintf("contended-%d", time.Now().UnixNano())
				var r Result
				for b.Loop() {
					r = Contend(context.Background(), acquirers, key, contention, rt)
				}
				b.ReportMetric(r.CyclesPerSec, "cycles/s")
				b.ReportMetric(ms(r.P50), "p50-ms")
				b.ReportMetric(ms(r.P99), "p99-ms")
				b.ReportMetric(ms(r.Max), "max-ms")
				b.ReportMetric(float64(r.GaveUp), "gaveup")
				if r.Errors > 0 {
					b.Errorf("%d errors", r.Errors)
				}
			})
		})
	}
}
