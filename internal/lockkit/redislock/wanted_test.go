package redislock_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
)

// A release nobody waits for sends no message: the PUBLISH would be a
// third command on every uncontended cycle (and, on a Cluster, a message
// to every node). The first message seen on any Locker's channel must
// therefore be the one this test sends after the cycles.
func TestReleaseWithoutWaitersSendsNoMessage(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	l := newLocker(t, newClient(t, addr))
	ctx := context.Background()
	key := uniqueKey(t)
	channel := "redislock:end-" + key
	sub := admin.PSubscribe(ctx, "redislock:*")
	if _, err := sub.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	for range 3 {
		_ = hold(t, l, key).Release(ctx)
		lease, err := l.TryAcquire(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		// A refused TryAcquire does not wait: no message is due either.
		if _, err := l.TryAcquire(ctx, key); err == nil {
			t.Fatal("TryAcquire of a held key succeeded")
		}
		_ = lease.Release(ctx)
	}
	admin.Publish(ctx, channel, "end")
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Payload != "end" {
		t.Errorf("a release nobody waited for sent %q", msg.Payload)
	}
	_ = sub.Close()
}

// A waiter of another process is woken by the release message, not by
// the holder's lease running out: its refused attempt asked for one.
func TestReleaseWakesAWaiterOfAnotherProcess(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	ctx := context.Background()
	holder, waiter := newLocker(t, newClient(t, addr)), newLocker(t, newClient(t, addr))
	key := uniqueKey(t)
	lease := hold(t, holder, key, lockkit.WithTTL(time.Minute))
	got := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		l, err := waiter.Acquire(wctx, key)
		if err == nil {
			err = l.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(200 * time.Millisecond) // refused and subscribed
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Errorf("waiter: %v", err)
	}
}

// Waiters of one process hand the key on with one call each: the release
// grants the key to the next waiter here in the same script (when nobody
// elsewhere marked it), so a hand-off is not a release and then the
// waiter's own acquire. The waiter whose turn comes because the one ahead
// of it here was granted the key does not ask Redis while that grant
// lasts (it would be refused, and its refusal would mark the key and so
// stop the next hand-over here).
func TestWaitersHereHandOnWithTwoCallsEach(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	w := locktest.NewWire(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, Dialer: w.DialContext})
	t.Cleanup(func() { _ = c.Close() })
	l := newLocker(t, c)
	ctx := context.Background()
	key := uniqueKey(t)

	const goroutines, rounds = 4, 5
	holder := hold(t, l, key)
	var wg sync.WaitGroup
	for range goroutines {
		wg.Go(func() {
			for range rounds {
				lease, err := l.Acquire(ctx, key, lockkit.WithTTL(time.Minute))
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(20 * time.Millisecond)
				_ = lease.Release(ctx)
			}
		})
	}
	time.Sleep(200 * time.Millisecond) // all queued, the head subscribed
	calls := w.Calls()
	_ = holder.Release(ctx)
	wg.Wait()
	handOffs := int64(goroutines * rounds)
	// Two per hand-off: the waiter's place in the queue (wait.lua; an
	// arrival while others wait here queues at once) and the release that
	// grants the key to the next one here (handoff.lua), whose reply is the
	// grant; and a few for the last waiters and the subscription.
	n := w.Calls() - calls
	t.Logf("%d hand-offs here took %d calls", handOffs, n)
	if n > 5*handOffs/2 {
		t.Errorf("%d hand-offs here took %d calls; want about 2 each", handOffs, n)
	}
}

// A waiter's mark sits in the holder's value (wait.lua): the holder
// still extends and releases its lease, and the release wakes the waiter
// of another process at once.
func TestMarkedLeaseStaysItsHolders(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	ctx := context.Background()
	holder, other := newLocker(t, newClient(t, addr)), newLocker(t, newClient(t, addr))
	key := uniqueKey(t)
	lease := hold(t, holder, key)
	waiter := acquireAsync(other, ctx, key, lockkit.WithWaitTimeout(30*time.Second))
	lock := "{" + testPrefix + key + "}"
	waitFor(t, 5*time.Second, "the waiter's mark", func() bool {
		return strings.HasSuffix(admin.Get(ctx, lock).Val(), "!")
	})
	if err := lease.Extend(ctx, 2*time.Minute); err != nil {
		t.Fatalf("extend of a marked lease: %v", err)
	}
	if pttl := admin.PTTL(ctx, lock).Val(); pttl <= time.Minute {
		t.Errorf("pttl %v after extending to 2m", pttl)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release of a marked lease: %v", err)
	}
	released := time.Now()
	got := <-waiter
	if got.err != nil {
		t.Fatalf("waiter: %v", got.err)
	}
	if d := got.at.Sub(released); d > 2*time.Second {
		t.Errorf("waiter granted %v after the release; want at once, not at the TTL", d)
	}
	_ = got.lease.Release(ctx)
}
