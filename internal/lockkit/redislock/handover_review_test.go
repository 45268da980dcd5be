package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
)

// The mark that makes a release free the key instead of handing it over
// is set by any refused waiter, this process's own head included. A
// release that finds only its own head's mark must still wake that head
// directly, as release.lua's path does: it must not depend on the release
// message. Here the subscription connection stalls (no error, so go-redis
// never reconnects and no confirmation comes): nobody else waits, the key
// is free, and the head here must be granted at once, not at the old
// holder's TTL.
func TestHeadHereWokenWhenReleaseFindsItsOwnMark(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	p := newProxy(t, addr)
	l := newLocker(t, newClient(t, p.addr))
	ctx := context.Background()
	key := uniqueKey(t)

	held := hold(t, l, key, lockkit.WithTTL(4*time.Second))
	waiter := acquireAsync(l, ctx, key, lockkit.WithWaitTimeout(10*time.Second))
	time.Sleep(200 * time.Millisecond) // subscribed, refused: the key is marked
	p.freeze(true)
	defer p.freeze(false)
	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-waiter
	if got.err != nil {
		t.Fatalf("waiter here, key free since %v: %v", time.Since(released), got.err)
	}
	defer got.lease.Release(ctx)
	if d := got.at.Sub(released); d > time.Second {
		t.Errorf("waiter here granted %v after its own process released the key; want at once", d)
	}
}

// A waiter's TTL below a millisecond is PX 0 in handover.lua, which Redis
// refuses with a script error: the releaser's Release must still free its
// key, not fail and leave it held for its full TTL because of somebody
// else's option.
func TestReleaseFreesKeyWhenHandOverToWaiterFails(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	l := newLocker(t, newClient(t, addr))
	ctx := context.Background()
	key := uniqueKey(t)
	lock := "{" + testPrefix + key + "}"

	holder := hold(t, l, key)
	first := acquireAsync(l, ctx, key)
	time.Sleep(100 * time.Millisecond) // the head, refused, marked
	// Queued behind the head: its turn comes when the head is granted,
	// and it then waits for this process's release without asking Redis.
	tiny := acquireAsync(l, ctx, key, lockkit.WithTTL(500*time.Microsecond), lockkit.WithWaitTimeout(2*time.Second))
	time.Sleep(50 * time.Millisecond)
	admin.Del(ctx, lock+":wanted") // so the release hands over to the head
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-first
	if got.err != nil {
		t.Fatal(got.err)
	}
	time.Sleep(50 * time.Millisecond) // the tiny waiter is the head now
	if err := got.lease.Release(ctx); err != nil {
		t.Errorf("release with a sub-millisecond waiter queued: %v", err)
	}
	<-tiny
	if pttl := admin.PTTL(ctx, lock).Val(); pttl > 0 {
		t.Errorf("key held by %q for %v more after every lease was released",
			admin.Get(ctx, lock).Val(), pttl)
	}
}

// The hand-over script runs on miniredis too (`make run`): a release with
// a waiter here and no mark hands over, with a higher token.
func TestHandOverRunsOnEmbeddedServer(t *testing.T) {
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()
	l := newLocker(t, client)
	ctx := context.Background()
	lock := "{" + testPrefix + "embedded-handover}"
	for range 3 {
		lease := hold(t, l, "embedded-handover")
		waiter := acquireAsync(l, ctx, "embedded-handover", lockkit.WithWaitTimeout(2*time.Second))
		time.Sleep(20 * time.Millisecond)
		m.Del(lock + ":wanted") // so that the release hands over
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		handed := m.Exists(lock) // set in the release's own script
		got := <-waiter
		if got.err != nil {
			t.Fatal(got.err)
		}
		if !handed {
			t.Errorf("the release freed the key instead of handing it over")
		}
		if got.lease.Fence() <= lease.Fence() {
			t.Errorf("handed token %d after %d", got.lease.Fence(), lease.Fence())
		}
		if err := got.lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if m.Exists(lock) {
			t.Fatalf("key still held after the handed lease's release")
		}
	}
}

// Close must not wait on a caller's Release for as long as go-redis's own
// timeouts and retries run: before the hand-over, Close returned at once
// here; with it, Close waits for the Release (10.5 s measured with a
// background context). A clean-up gets 500 ms; a hand-over under way
// should get no more.
func TestCloseNotHeldUpByHandOverAgainstBlackhole(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	p := newProxy(t, addr)
	l := newLocker(t, newClient(t, p.addr))
	key := uniqueKey(t)
	held := hold(t, l, key)
	waiter := acquireAsync(l, context.Background(), key)
	time.Sleep(200 * time.Millisecond) // a waiter here: the release hands over
	p.blackhole(true)
	released := make(chan error, 1)
	go func() { released <- held.Release(context.Background()) }()
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	_ = l.Close()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v behind a Release under way against an unreachable Redis", d)
	}
	<-waiter
	p.blackhole(false)
	<-released
}
