package faults

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/account"
)

// TestRedisClusterFailover is fault 4 on a Redis Cluster: the primary of
// the lock key's slot dies right after a grant its replica never received
// (replication cut, as in the Sentinel row); the cluster promotes the
// replica, which grants the key again while the first holder's lease is
// live. The token of the second grant is floored at the promoted server's
// clock, so it beats the first, and the fenced store refuses the stale
// holder's write.
func TestRedisClusterFailover(t *testing.T) {
	needFull(t)
	t.Parallel()
	nodes := redisCluster(t)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].addr, nodes[1].addr, nodes[2].addr},
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true})
	t.Cleanup(func() { cc.Close() })
	f := newLockedAccount(t, cc)
	// redislock keeps every key of a lock under the hash tag {prefix+key}.
	lockKey := "{" + f.prefix + account.Key(f.id).String() + "}"
	master, replica := shardOf(t, cc, nodes, lockKey)

	fo := failOver(t, f, master, func(killed time.Time) {
		awaitPromotion(t, replica, killed)
		awaitRoute(t, cc, lockKey, replica.addr)
	})
	res := fo.row("4 failover (Redis Cluster)")
	report(res)
	t.Logf("%+v (failover took %v)", res, fo.promoted.Round(time.Millisecond))
	fo.check(t)
}

// redisCluster starts a private Redis Cluster, three primaries with a
// replica each, made as scripts/testenv.sh makes the shared one (which is
// never failed over), without persistence, with a 1 s node timeout so that
// a failover takes seconds, and with no limit on a replica's data age for
// a failover: the replica this row promotes was cut off on purpose.
func redisCluster(t *testing.T) []*server {
	t.Helper()
	nodes := make([]*server, 6)
	addrs := make([]string, len(nodes))
	for i := range nodes {
		port := freePort(t)
		s := &server{t: t, kind: "redis-cluster", dir: t.TempDir(), addr: fmt.Sprintf("127.0.0.1:%d", port)}
		s.args = []string{"redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "",
			"--appendonly", "no", "--dir", s.dir, "--protected-mode", "no", "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-port", fmt.Sprint(freePort(t)),
			"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0",
			"--repl-diskless-sync-delay", "0"}
		s.ready = redisReady(s.addr)
		s.start()
		t.Cleanup(func() { s.stop(syscall.SIGKILL) })
		nodes[i], addrs[i] = s, s.addr
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	args := append(append([]string{"--cluster", "create"}, addrs...), "--cluster-replicas", "1", "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput()
	cancel()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	ctx = context.Background()
	for _, s := range nodes {
		c := redis.NewClient(&redis.Options{Addr: s.addr})
		// cluster_state:ok needs every slot served, not the replicas: a
		// node may learn a replica's role by gossip later, so wait until
		// every node knows all three.
		waitUntil(t, s.addr+": cluster_state:ok, 3 replicas known, a replica's link up", func() bool {
			state, _ := c.ClusterInfo(ctx).Result()
			nodes, _ := c.ClusterNodes(ctx).Result()
			repl, _ := c.Info(ctx, "replication").Result()
			return strings.Contains(state, "cluster_state:ok") && replicasKnown(nodes) == 3 &&
				(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up"))
		})
		c.Close()
	}
	return nodes
}

// replicasKnown counts the replicas in a CLUSTER NODES reply.
func replicasKnown(nodes string) int {
	n := 0
	for _, line := range strings.Split(nodes, "\n") {
		if f := strings.Fields(line); len(f) > 2 && strings.Contains(f[2], "slave") {
			n++
		}
	}
	return n
}

// shardOf returns the primary serving key's slot and its replica.
func shardOf(t *testing.T, cc *redis.ClusterClient, nodes []*server, key string) (primary, replica *server) {
	t.Helper()
	ctx := context.Background()
	slot, err := cc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	shards, err := cc.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	byAddr := func(n redis.Node) *server {
		addr := net.JoinHostPort(n.IP, strconv.FormatInt(n.Port, 10))
		i := slices.IndexFunc(nodes, func(s *server) bool { return s.addr == addr })
		if i < 0 {
			t.Fatalf("node %s is not one of the cluster's", addr)
		}
		return nodes[i]
	}
	for _, s := range shards {
		if !slices.ContainsFunc(s.Slots, func(r redis.SlotRange) bool { return r.Start <= slot && slot <= r.End }) {
			continue
		}
		for _, n := range s.Nodes {
			switch n.Role {
			case "master":
				primary = byAddr(n)
			case "replica":
				replica = byAddr(n)
			}
		}
	}
	if primary == nil || replica == nil {
		t.Fatalf("slot %d: primary %v, replica %v", slot, primary, replica)
	}
	return primary, replica
}

// awaitRoute waits for the cluster client to send key to addr,
// the promoted replica, reloading its slot map as a client does after
// errors.
func awaitRoute(t *testing.T, cc *redis.ClusterClient, key, addr string) {
	t.Helper()
	ctx := context.Background()
	waitUntil(t, "the route of "+key+" to "+addr, func() bool {
		cc.ReloadState(ctx)
		node, err := cc.MasterForKey(ctx, key)
		return err == nil && node.Options().Addr == addr && node.Ping(ctx).Err() == nil
	})
}
