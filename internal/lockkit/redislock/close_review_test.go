package redislock_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

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
