package redislock_test

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/testenv"
)

// After a Redis Cluster failover of the shard holding a contended key,
// every instance can still acquire that key, waiters are still woken by
// releases, and no instance waits out a holder's TTL. Redisson had exactly
// this bug (redisson/redisson#4822: after a failover only the instance that
// had held the lock could get it again).
func TestClusterFailoverEveryInstanceCanAcquire(t *testing.T) {
	addrs := serverAddrs(t, "SHOP_TEST_REDIS_CLUSTER_ADDRS")
	ctx := context.Background()
	newCluster := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		return c
	}
	admin := newCluster()
	key := uniqueKey(t)
	replica := shardReplica(t, admin, "{"+testPrefix+key+"}")
	rc := newClient(t, replica)
	waitFor(t, 30*time.Second, "the replica's link to its master", func() bool {
		info, _ := rc.Info(ctx, "replication").Result()
		return strings.Contains(info, "master_link_status:up")
	})

	const instances = 3
	lockers := make([]lockkit.Locker, instances)
	for i := range lockers {
		lockers[i] = newLocker(t, newCluster())
	}
	// A long TTL: a waiter granted within seconds was woken, not timed out.
	const ttl = 30 * time.Second
	const prompt = 3 * time.Second
	contend := func(phase string, failover func()) {
		t.Helper()
		held := hold(t, lockers[0], key, lockkit.WithTTL(ttl))
		results := make(chan error, instances-1)
		for _, l := range lockers[1:] {
			go func() {
				lease, err := l.Acquire(ctx, key, lockkit.WithTTL(ttl), lockkit.WithWaitTimeout(ttl/2))
				if err == nil {
					err = lease.Release(ctx)
				}
				results <- err
			}()
		}
		time.Sleep(200 * time.Millisecond)
		failover()
		if err := held.Release(ctx); err != nil {
			t.Fatalf("%s: holder's release: %v", phase, err)
		}
		for range instances - 1 {
			if err := <-results; err != nil {
				t.Fatalf("%s: a waiting instance: %v", phase, err)
			}
		}
	}

	start := time.Now()
	contend("failover while contended", func() {
		if err := rc.Do(ctx, "CLUSTER", "FAILOVER").Err(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 30*time.Second, "the replica's promotion", func() bool {
			role, _ := rc.Do(ctx, "ROLE").Slice()
			return len(role) > 0 && role[0] == "master"
		})
	})
	if d := time.Since(start); d > 2*prompt {
		t.Errorf("waiters granted %v after the failover began", d)
	}
	for i, l := range lockers {
		lease, err := l.Acquire(ctx, key, lockkit.WithTTL(ttl), lockkit.WithWaitTimeout(prompt))
		if err != nil {
			t.Fatalf("after the failover, instance %d: %v", i, err)
		}
		_ = lease.Release(ctx)
	}
	start = time.Now()
	contend("contended after the failover", func() {})
	if d := time.Since(start); d > prompt {
		t.Errorf("waiters granted %v after the release", d)
	}
}

// shardReplica returns the address of a replica of the shard that holds key.
func shardReplica(t *testing.T, c *redis.ClusterClient, key string) string {
	ctx := context.Background()
	slot, err := c.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	shards, err := c.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range shards {
		if !slices.ContainsFunc(s.Slots, func(r redis.SlotRange) bool { return r.Start <= slot && slot <= r.End }) {
			continue
		}
		for _, n := range s.Nodes {
			if n.Role == "replica" && n.Health == "online" {
				return net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
			}
		}
		testenv.Missing(t, "slot %d's shard has no replica online; the test cluster needs one per master (scripts/testenv.sh up adds them)", slot)
	}
	t.Fatalf("no shard serves slot %d", slot)
	return ""
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// A Locker on a Redis Cluster listens for its messages on every master: a
// release's message then reaches it from the node that ran the release,
// not across the cluster bus, whose node-to-node links are written
// without TCP_NODELAY (redis/redis#11869, valkey-io/valkey#1758): there a
// message waited up to 40 ms behind the one before it.
func TestClusterLockerListensOnEveryMaster(t *testing.T) {
	addrs := serverAddrs(t, "SHOP_TEST_REDIS_CLUSTER_ADDRS")
	ctx := context.Background()
	admin := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { admin.Close() })
	channels := func() map[string]int { // channel: how many masters have it
		seen := map[string]int{}
		var mu sync.Mutex
		err := admin.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			names, err := m.PubSubChannels(ctx, "redislock:*").Result()
			mu.Lock()
			defer mu.Unlock()
			for _, n := range names {
				seen[n]++
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return seen
	}
	var masters atomic.Int64
	_ = admin.ForEachMaster(ctx, func(context.Context, *redis.Client) error { masters.Add(1); return nil })
	before := channels()

	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	holder, waiter := newLocker(t, c), newLocker(t, c)
	key := uniqueKey(t)
	held := hold(t, holder, key)
	waited := make(chan error, 1)
	go func() {
		lease, err := waiter.Acquire(ctx, key, lockkit.WithWaitTimeout(10*time.Second))
		if err == nil {
			err = lease.Release(ctx)
		}
		waited <- err
	}()
	waitFor(t, 5*time.Second, "waiter's channel on every master", func() bool {
		for name, n := range channels() {
			if before[name] == 0 && int64(n) == masters.Load() {
				return true
			}
		}
		return false
	})
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatal(err)
	}
}
