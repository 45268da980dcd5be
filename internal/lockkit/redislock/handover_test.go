package redislock_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

// unmark takes the waiters' mark (a trailing '!', acquire.lua) off the
// lease on KEYS[1], keeping its owner and TTL.
var unmark = redis.NewScript(`
local held = redis.call('GET', KEYS[1])
if held and string.sub(held, -1) == '!' then
  redis.call('SET', KEYS[1], string.sub(held, 1, -2), 'KEEPTTL')
end
return 0`)

// clearMark unmarks the lease on lock: a release that finds the mark
// frees the key instead of handing it over here.
func clearMark(ctx context.Context, c redis.Scripter, lock string) {
	_ = unmark.Run(ctx, c, []string{lock}).Err()
}

// A waiter whose context ends while the key is handed to it either takes
// the grant or leaves it to be freed: afterwards the key is free (or held
// by a lease somebody has), never held until its TTL by nobody.
func TestHandOverToWaiterGivingUpStrandsNoGrant(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	l := newLocker(t, newClient(t, addr))
	ctx := context.Background()
	key := uniqueKey(t)
	lock := "{" + testPrefix + key + "}"

	for i := range 60 {
		holder := hold(t, l, key)
		wctx, cancel := context.WithCancel(ctx)
		waiter := acquireAsync(l, wctx, key)
		time.Sleep(20 * time.Millisecond) // queued, refused, subscribed
		// Hand-overs that find the mark free the key instead: clear it,
		// so that this release hands over.
		go func() {
			time.Sleep(time.Duration(rand.IntN(400)) * time.Microsecond)
			cancel()
		}()
		_ = holder.Release(ctx)
		if got := <-waiter; got.err == nil {
			if err := got.lease.Release(ctx); err != nil {
				t.Fatalf("round %d: the handed lease's release: %v", i, err)
			}
		}
		cancel()
		deadline := time.Now().Add(2 * time.Second)
		for admin.Exists(ctx, lock).Val() != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: key held by %q with nobody holding a lease (pttl %v)",
					i, admin.Get(ctx, lock).Val(), admin.PTTL(ctx, lock).Val())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
}

// Close racing a hand-over leaves no goroutine behind and no grant held by
// nobody: a waiter closed out of its turn frees what it was handed.
func TestCloseDuringHandOverLeaksNothing(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	client := newClient(t, addr)
	ctx := context.Background()
	key := uniqueKey(t)
	lock := "{" + testPrefix + key + "}"
	baseline := goleak.IgnoreCurrent()

	for i := range 40 {
		l, err := redislock.New(client, redislock.WithPrefix(testPrefix))
		if err != nil {
			t.Fatal(err)
		}
		holder := hold(t, l, key)
		waiters := []<-chan acquired{acquireAsync(l, ctx, key), acquireAsync(l, ctx, key)}
		time.Sleep(20 * time.Millisecond)
		released := make(chan struct{})
		go func() {
			defer close(released)
			_ = holder.Release(ctx)
		}()
		time.Sleep(time.Duration(rand.IntN(400)) * time.Microsecond)
		_ = l.Close()
		<-released
		for _, w := range waiters {
			if got := <-w; got.err == nil {
				if err := got.lease.Release(ctx); err != nil {
					t.Fatalf("round %d: a lease granted before Close: release: %v", i, err)
				}
			}
		}
		if admin.Exists(ctx, lock).Val() != 0 {
			t.Fatalf("round %d: key held by %q after Close with every lease released",
				i, admin.Get(ctx, lock).Val())
		}
	}
	goleak.VerifyNone(t, baseline)
	if n := client.PoolStats().PubSubStats.Active; n != 0 {
		t.Errorf("%d subscription connections open after every Locker closed", n)
	}
}

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

// A waiter's TTL below a millisecond would be PX 0 when a release grants
// it the key, which Redis refuses with a script error: the releaser's
// Release must still succeed, and the key must not stay held for longer
// than the tiny lease because of somebody else's option.
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
	tiny := acquireAsync(l, ctx, key, lockkit.WithTTL(500*time.Microsecond), lockkit.WithWaitTimeout(2*time.Second))
	time.Sleep(50 * time.Millisecond)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-first
	if got.err != nil {
		t.Fatal(got.err)
	}
	if err := got.lease.Release(ctx); err != nil {
		t.Errorf("release with a sub-millisecond waiter queued: %v", err)
	}
	<-tiny
	time.Sleep(10 * time.Millisecond) // the tiny lease's own 1 ms runs out
	if pttl := admin.PTTL(ctx, lock).Val(); pttl > 0 {
		t.Errorf("key held by %q for %v more after every lease was released",
			admin.Get(ctx, lock).Val(), pttl)
	}
}

// The scripts that queue and hand on run on miniredis too (`make run`): a
// release with a waiter here hands the key over, with a higher token.
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
