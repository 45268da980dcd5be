package lockbench

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockbench/shop/internal/lockkit/etcdlock"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/lockkit/zklock"
)

// redisClusterGroup measures shop-redis and redsync on the Redis Cluster
// of scripts/testenv.sh (3 masters): a release's message to a waiter in
// another Locker leaves from the key's master, which the waiter's Locker
// listens on too (redislock's inbox).
func redisClusterGroup() group {
	addrs := strings.Split(os.Getenv("SHOP_TEST_REDIS_CLUSTER_ADDRS"), ",")
	newClient := func(b *testing.B) *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, PoolSize: 64, ContextTimeoutEnabled: true})
		b.Cleanup(func() { _ = c.Close() })
		return c
	}
	return group{
		name: "redis-cluster",
		env:  "SHOP_TEST_REDIS_CLUSTER_ADDRS",
		roundTrip: func(b *testing.B) func(context.Context) error {
			c := newClient(b)
			// The key's master, as every cycle's commands go.
			return func(ctx context.Context) error { return c.Exists(ctx, "bench:{roundtrip}").Err() }
		},
		subjects: []subject{
			{name: "shop-redis", backend: "redis", open: shared(func(b *testing.B) Acquirer {
				l, err := redislock.New(newClient(b), redislock.WithPrefix("bench:"))
				return lockkitAcquirer(closeWith(b, l, err), long)
			})},
			{name: "redsync", open: shared(func(b *testing.B) Acquirer {
				return redsyncAcquirer(newClient(b))
			})},
		},
	}
}

// etcdClusterGroup and zookeeperEnsembleGroup measure shop's Lockers on
// the 3-member cluster and ensemble of scripts/testenv.sh, beside the
// standalone servers' groups: the same round trips per cycle, but every
// write a grant or a release makes is replicated (the leader answers once
// a follower has it on disk), which is what a quorum costs per grant.
func etcdClusterGroup() group {
	endpoints := strings.Split(os.Getenv("SHOP_TEST_ETCD_CLUSTER_ENDPOINTS"), ",")
	client := func(b *testing.B) *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		return c
	}
	return group{
		name: "etcd-3-members",
		env:  "SHOP_TEST_ETCD_CLUSTER_ENDPOINTS",
		roundTrip: func(b *testing.B) func(context.Context) error {
			c := client(b)
			return func(ctx context.Context) error { _, err := c.Get(ctx, "/bench/ping"); return err }
		},
		writeRoundTrip: func(b *testing.B) func(context.Context) error { return etcdWrite(client(b)) },
		subjects: []subject{
			{name: "shop-etcd", backend: "etcd", open: shared(func(b *testing.B) Acquirer {
				l, err := etcdlock.FromClient(client(b), etcdlock.WithPrefix("/bench/shop/"))
				return lockkitAcquirer(closeWith(b, l, err), long)
			})},
		},
	}
}

func zookeeperEnsembleGroup() group {
	addrs := strings.Split(os.Getenv("SHOP_TEST_ZK_ENSEMBLE_ADDRS"), ",")
	conn := func(b *testing.B) *zk.Conn {
		c, _, err := zk.Connect(addrs, 10*time.Second, zk.WithLogInfo(false))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		return c
	}
	return group{
		name: "zookeeper-3-members",
		env:  "SHOP_TEST_ZK_ENSEMBLE_ADDRS",
		roundTrip: func(b *testing.B) func(context.Context) error {
			c := conn(b)
			return func(context.Context) error { _, _, err := c.Exists("/"); return err }
		},
		writeRoundTrip: func(b *testing.B) func(context.Context) error { return zkWrite(b, conn(b)) },
		subjects: []subject{
			{name: "shop-zookeeper", backend: "zookeeper", open: shared(func(b *testing.B) Acquirer {
				l, err := zklock.New(addrs, 10*time.Second, zklock.WithRoot("/bench/shop"))
				return lockkitAcquirer(closeWith(b, l, err), long)
			})},
		},
	}
}
