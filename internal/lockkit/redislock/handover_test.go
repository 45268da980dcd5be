package redislock_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/testenv"
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

// A release hands the key to a waiter of its own process for a run at most
// while somebody elsewhere waits: a waiter of another process marks the key
// when refused, and the release that ends the run frees it instead. Without
// that check a process with a steady stream of its own waiters would keep
// the key for ever.
func TestWaiterElsewhereNotStarvedByHandOversHere(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	a, b := newLocker(t, newClient(t, addr)), newLocker(t, newClient(t, addr))
	ctx := context.Background()
	key := uniqueKey(t)

	grantsHere, stop := streamHere(t, a, key, 3, 5*time.Millisecond, 0)
	defer stop()
	time.Sleep(100 * time.Millisecond) // the stream runs
	start := grantsHere.Load()
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lease, err := b.Acquire(wctx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("waiter elsewhere, after %d grants here: %v", grantsHere.Load()-start, err)
	}
	_ = lease.Release(ctx)
	// Its first attempt does not mark; then the grants here run on for up
	// to backend.HandOffRun, and the release that ends the run frees the
	// key, for which it races the waiter here on the same message (plain
	// locks promise no order between processes), a race that leaves the
	// next run at backend.HandOffRun: 0 to 55 grants here seen first.
	// Without the mark check the stream kept the key through 920
	// grants, until the 5 s wait ran out.
	n := grantsHere.Load() - start
	t.Logf("waiter elsewhere granted after %d grants here", n)
	if n > 300 {
		t.Errorf("waiter elsewhere granted after %d grants here; want it served between the grants here, not after them", n)
	}
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
		clearMark(ctx, admin, lock)
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
		clearMark(ctx, admin, lock)
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

// A waiter elsewhere does not stop the hand-overs here at once: a process
// with waiters of its own hands the key on, one call each, for a run of
// backend.HandOffRun, and only then frees it for the waiters elsewhere.
// Before, the first release that found the mark freed the key, and every
// hand-off here was a release and an acquire: the 4 hand-offs below took
// 9 or 10 calls, where the run takes 6 or 7.
func TestWaitersHereKeepAMarkedKeyForARun(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	w := locktest.NewWire(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, Dialer: w.DialContext})
	t.Cleanup(func() { _ = c.Close() })
	here, elsewhere := newLocker(t, c), newLocker(t, newClient(t, addr))
	ctx := context.Background()
	key := uniqueKey(t)

	holder := hold(t, here, key)
	other := make(chan error, 1)
	go func() {
		lease, err := elsewhere.Acquire(ctx, key, lockkit.WithTTL(time.Minute), lockkit.WithWaitTimeout(10*time.Second))
		if err == nil {
			time.Sleep(10 * time.Millisecond)
			err = lease.Release(ctx)
		}
		other <- err
	}()
	time.Sleep(100 * time.Millisecond) // refused: the key is marked
	const waitersHere = 4
	var wg sync.WaitGroup
	for range waitersHere {
		wg.Go(func() {
			lease, err := here.Acquire(ctx, key, lockkit.WithTTL(time.Minute))
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(10 * time.Millisecond)
			_ = lease.Release(ctx)
		})
	}
	time.Sleep(200 * time.Millisecond) // all queued here
	calls := w.Calls()
	_ = holder.Release(ctx)
	wg.Wait()
	if err := <-other; err != nil {
		t.Fatalf("waiter elsewhere: %v", err)
	}
	// The holder's hand-over and three more, then the last one's release
	// and the unsubscribe: 6 or 7 writes here.
	n := w.Calls() - calls
	t.Logf("%d hand-offs here with a waiter elsewhere took %d calls", waitersHere, n)
	if n > waitersHere+3 {
		t.Errorf("%d hand-offs here with a waiter elsewhere took %d calls; want one each", waitersHere, n)
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
	clearMark(ctx, admin, lock) // so the release hands over to the head
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
		clearMark(ctx, client, lock) // so that the release hands over
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

// A hand-over whose reply was lost after it ran is resent by go-redis and
// finds the key already handed to the waiter's fresh owner: it must answer
// that hand-over again, not report the releaser's lease gone and leave the
// key held for the waiter's TTL by an owner nobody has.
func TestResentHandOverIsOurs(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	src := readScripts(t, "handover.lua", "fence.lua")
	if err := admin.ScriptLoad(ctx, src).Err(); err != nil {
		t.Fatal(err) // the cut reply must be the hand-over's, not a NOSCRIPT
	}
	sum := sha1.Sum([]byte(src))
	cutter, via := testenv.NewReplyCutter(t, addr, []byte(hex.EncodeToString(sum[:])))
	l := newLocker(t, newClient(t, via))
	key := uniqueKey(t)
	lock := "{" + testPrefix + key + "}"

	lease := hold(t, l, key, lockkit.WithTTL(30*time.Second))
	waiter := acquireAsync(l, ctx, key, lockkit.WithTTL(30*time.Second))
	// It subscribes once in line: the release then hands the key to it.
	for admin.PubSubNumSub(ctx, lock+":released").Val()[lock+":released"] == 0 {
		if ctx.Err() != nil {
			t.Fatal("the waiter never subscribed")
		}
		time.Sleep(time.Millisecond)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("release handing over with its reply lost: %v", err)
	}
	if !cutter.Cut() {
		t.Fatal("no reply was lost; the test did not set up what it means to")
	}
	got := <-waiter
	if got.err != nil {
		t.Fatalf("waiter handed the key with the reply lost: %v", got.err)
	}
	if got.lease.Fence() <= lease.Fence() {
		t.Fatalf("handed-over fence %d after the releaser's %d", got.lease.Fence(), lease.Fence())
	}
	if err := got.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	next := hold(t, newLocker(t, admin), key)
	_ = next.Release(ctx)
}

// readScripts returns the named scripts of this package joined, as the
// package joins them into one script.
func readScripts(t *testing.T, names ...string) string {
	var src strings.Builder
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	return src.String()
}
