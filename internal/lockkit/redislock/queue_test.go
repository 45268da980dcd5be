package redislock_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

// A waiter in another process that is granted the key and dies before it
// claims it (here: its connection goes silent, so neither its claim nor
// its leave reaches Redis) holds the key up for its claim window, not for
// its place's waiter timeout or its lease: the waiter behind it is told
// that it is next and takes the key once the window has passed. The dead
// waiter's place would last 20 s and its lease a minute; the live waiter
// gives up after 5 s.
func TestWaiterDeadAfterGrantHoldsKeyForItsClaimWindowOnly(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	p := newProxy(t, addr)
	holder := newLocker(t, newClient(t, addr))
	doomed := newLocker(t, newClient(t, p.addr),
		redislock.WithClaimWindow(300*time.Millisecond), redislock.WithWaiterTimeout(20*time.Second))
	alive := newLocker(t, newClient(t, addr))
	ctx := context.Background()
	key := uniqueKey(t)

	held := hold(t, holder, key)
	doomedCtx, cancelDoomed := context.WithCancel(ctx)
	defer cancelDoomed()
	dead := acquireAsync(doomed, doomedCtx, key)
	time.Sleep(100 * time.Millisecond) // queued first
	live := acquireAsync(alive, ctx, key, lockkit.WithWaitTimeout(5*time.Second))
	time.Sleep(100 * time.Millisecond) // queued behind it
	p.blackhole(true)
	defer p.blackhole(false)

	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-live
	if got.err != nil {
		t.Fatalf("waiter behind one that died after its grant: %v", got.err)
	}
	_ = got.lease.Release(ctx)
	cancelDoomed()
	if d := <-dead; d.err == nil {
		t.Fatal("the silenced waiter was granted")
	}
}

// A waiter that gives up while the key is granted to it hands the key on
// at once (its leave, handoff.lua), with no claim window to wait out.
func TestWaiterGivingUpAfterGrantHandsKeyOn(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	p := newProxy(t, addr)
	holder := newLocker(t, newClient(t, addr))
	// The claim window is long, and the quitter looks on its own only every
	// 10 s: only its leave can hand the key on in time.
	quitter := newLocker(t, newClient(t, p.addr),
		redislock.WithClaimWindow(time.Minute), redislock.WithWaiterTimeout(30*time.Second))
	alive := newLocker(t, newClient(t, addr))
	ctx := context.Background()
	key := uniqueKey(t)
	lock := "{" + testPrefix + key + "}"

	held := hold(t, holder, key)
	quitCtx, quit := context.WithCancel(ctx)
	gaveUp := acquireAsync(quitter, quitCtx, key)
	time.Sleep(100 * time.Millisecond)
	live := acquireAsync(alive, ctx, key, lockkit.WithWaitTimeout(10*time.Second))
	time.Sleep(100 * time.Millisecond)
	// The grant's message is held back; the quitter's commands are not.
	p.freeze(true)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the grant to the quitter", func() bool {
		v := admin.Get(ctx, lock).Val()
		return v != "" && admin.PTTL(ctx, lock).Val() > 10*time.Second
	})
	quit()
	if got := <-gaveUp; got.err == nil {
		t.Fatal("the quitter claimed a grant it was never told of")
	}
	got := <-live
	if got.err != nil {
		t.Fatalf("waiter behind one that gave up after its grant: %v", got.err)
	}
	_ = got.lease.Release(ctx)
}

// A hand-off between processes costs the waiter four calls, none of them
// a poll: its arrival (refused), its place in the queue, its claim once a
// release granted it the key and told it, and its own release, which
// grants the next one. Three Lockers with one goroutine each, as three
// processes, take turns on one key.
func TestHandOffBetweenProcessesTakesFourCallsEach(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	w := locktest.NewWire(t)
	ctx := context.Background()
	key := uniqueKey(t)
	const lockers, rounds = 3, 10
	var ls []*redislock.Locker
	for range lockers {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, Dialer: w.DialContext})
		t.Cleanup(func() { _ = c.Close() })
		ls = append(ls, newLocker(t, c))
	}
	holder := hold(t, ls[0], key)
	var wg sync.WaitGroup
	for _, l := range ls {
		wg.Go(func() {
			for range rounds {
				lease, err := l.Acquire(ctx, key, lockkit.WithTTL(time.Minute))
				if err != nil {
					t.Error(err)
					return
				}
				time.Sleep(5 * time.Millisecond)
				_ = lease.Release(ctx)
			}
		})
	}
	time.Sleep(200 * time.Millisecond) // all queued, subscribed
	calls := w.Calls()
	_ = holder.Release(ctx)
	wg.Wait()
	grants := int64(lockers * rounds)
	n := w.Calls() - calls
	t.Logf("%d grants between %d processes took %d calls", grants, lockers, n)
	if n > 5*grants {
		t.Errorf("%d grants between processes took %d calls; want about 4 each", grants, n)
	}
}
