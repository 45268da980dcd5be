package redislock_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

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
	// locks promise no order between processes): 0 to 36 grants here seen
	// first. Without the mark check the stream kept the key through 920
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
		admin.Del(ctx, lock+":wanted")
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
		admin.Del(ctx, lock+":wanted")
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
