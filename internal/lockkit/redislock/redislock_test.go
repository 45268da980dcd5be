package redislock_test

import (
	"context"
	"errors"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
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

// A grant whose reply was lost after it ran is resent by go-redis (its
// default retries); the resend finds the key held by its own owner value
// and must answer it as the grant it is, with a token above every earlier
// one, rather than refuse it and leave the caller waiting for its own
// lease or the key locked for the TTL.
func TestResentGrantIsOurs(t *testing.T) {
	cases := []struct {
		name string
		opts []lockkit.Option
		try  bool
	}{
		{"Acquire", nil, false},
		{"TryAcquire", nil, true},
		{"UnfencedAcquire", []lockkit.Option{lockkit.WithoutFence()}, false},
		{"UnfencedTryAcquire", []lockkit.Option{lockkit.WithoutFence()}, true},
	}
	servers := []struct {
		name string
		// dial returns a client that reaches the key's server through
		// the cutter of trigger, and one that reaches it directly.
		dial func(t *testing.T, trigger []byte) (cut, direct redis.UniversalClient, replyLost func() bool)
	}{
		{"SingleNode", func(t *testing.T, trigger []byte) (redis.UniversalClient, redis.UniversalClient, func() bool) {
			addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
			cutter, via := testenv.NewReplyCutter(t, addr, trigger)
			return newClient(t, via), newClient(t, addr), cutter.Cut
		}},
		{"Cluster", func(t *testing.T, trigger []byte) (redis.UniversalClient, redis.UniversalClient, func() bool) {
			addrs := serverAddrs(t, "SHOP_TEST_REDIS_CLUSTER_ADDRS")
			// Every node the client dials, masters after a failover
			// included, is reached through a cutter of its own.
			var mu sync.Mutex
			via := make(map[string]string)
			var cutters []*testenv.ReplyCutter
			var d net.Dialer
			cut := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true,
				Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
					mu.Lock()
					if _, ok := via[addr]; !ok {
						c, v := testenv.NewReplyCutter(t, addr, trigger)
						via[addr], cutters = v, append(cutters, c)
					}
					addr = via[addr]
					mu.Unlock()
					return d.DialContext(ctx, network, addr)
				}})
			direct := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
			t.Cleanup(func() { cut.Close(); direct.Close() })
			return cut, direct, func() bool {
				mu.Lock()
				defer mu.Unlock()
				return slices.ContainsFunc(cutters, (*testenv.ReplyCutter).Cut)
			}
		}},
	}
	for _, s := range servers {
		for _, c := range cases {
			t.Run(s.name+"/"+c.name, func(t *testing.T) {
				key := uniqueKey(t)
				cutClient, directClient, replyLost := s.dial(t, []byte("{"+testPrefix+key+"}"))
				direct := newLocker(t, directClient)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				// A first grant loads the scripts and the key's counter, so
				// that the cut reply is the grant's, not a NOSCRIPT.
				opts := append([]lockkit.Option{lockkit.WithTTL(30 * time.Second)}, c.opts...)
				first := hold(t, direct, key, opts...)
				if err := first.Release(ctx); err != nil {
					t.Fatal(err)
				}

				l := newLocker(t, cutClient)
				acquire := l.Acquire
				if c.try {
					acquire = l.TryAcquire
				}
				lease, err := acquire(ctx, key, opts...)
				if err != nil {
					t.Fatalf("grant whose reply was lost: %v", err)
				}
				if !replyLost() {
					t.Fatal("no reply was lost; the test did not set up what it means to")
				}
				if lease.Fence() != 0 && lease.Fence() <= first.Fence() {
					t.Fatalf("fence %d after an earlier grant's %d", lease.Fence(), first.Fence())
				}
				if _, err := direct.TryAcquire(ctx, key, c.opts...); !errors.Is(err, lockkit.ErrNotAcquired) {
					t.Fatalf("TryAcquire of the resent grant's key = %v, want ErrNotAcquired", err)
				}
				if err := lease.Release(ctx); err != nil {
					t.Fatalf("release of the resent grant: %v", err)
				}
				next := hold(t, direct, key, c.opts...)
				defer next.Release(context.Background())
				if next.Fence() != 0 && next.Fence() <= lease.Fence() {
					t.Fatalf("fence %d after the resent grant's %d", next.Fence(), lease.Fence())
				}
			})
		}
	}
}
