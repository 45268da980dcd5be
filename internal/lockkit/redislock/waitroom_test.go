package redislock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

const testPrefix = "redislock-test:"

// uniqueKey names a key no earlier run used, so no old counter or queue
// is in the way.
func uniqueKey(t *testing.T) string {
	return t.Name() + "-" + time.Now().Format("150405.000000000")
}

// newClient connects to addr as the service does (cmd/shop/app.go): with
// ContextTimeoutEnabled, so that a context bounds every call.
func newClient(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

func newLocker(t *testing.T, c redis.UniversalClient, opts ...redislock.Option) *redislock.Locker {
	l, err := redislock.New(c, append([]redislock.Option{redislock.WithPrefix(testPrefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func hold(t *testing.T, l lockkit.Locker, key string, opts ...lockkit.Option) lockkit.Lease {
	t.Helper()
	lease, err := l.TryAcquire(context.Background(), key, append([]lockkit.Option{lockkit.WithTTL(time.Minute)}, opts...)...)
	if err != nil {
		t.Fatalf("hold %s: %v", key, err)
	}
	return lease
}

type acquired struct {
	lease lockkit.Lease
	err   error
	at    time.Time
}

func acquireAsync(l lockkit.Locker, ctx context.Context, key string, opts ...lockkit.Option) <-chan acquired {
	ch := make(chan acquired, 1)
	go func() {
		lease, err := l.Acquire(ctx, key, append([]lockkit.Option{lockkit.WithTTL(time.Minute)}, opts...)...)
		ch <- acquired{lease, err, time.Now()}
	}()
	return ch
}

// A SUBSCRIBE lost with its connection, sent by a waiter that gave up
// before go-redis reconnected, must not leave the key unwaitable in this
// process: a later waiter is granted as soon as the key frees.
func TestWaiterAfterLostSubscribeIsGranted(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	p := newProxy(t, addr)
	holder := newLocker(t, newClient(t, addr))
	l := newLocker(t, newClient(t, p.addr))
	key, other := uniqueKey(t), uniqueKey(t)+"-other"
	ctx := context.Background()

	heldOther := hold(t, holder, other)
	held := hold(t, holder, key)
	// A waiter on another key opens the Locker's subscription connection.
	otherWaiter := acquireAsync(l, ctx, other)
	time.Sleep(200 * time.Millisecond)

	p.freeze(true) // the next SUBSCRIBE goes nowhere
	if _, err := l.Acquire(ctx, key, lockkit.WithWaitTimeout(300*time.Millisecond)); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("waiter behind a frozen subscription: %v, want ErrNotAcquired", err)
	}
	p.killSubscribers() // the connection dies with the SUBSCRIBE unanswered
	p.freeze(false)
	time.Sleep(300 * time.Millisecond) // go-redis reconnects

	waiter := acquireAsync(l, ctx, key, lockkit.WithWaitTimeout(5*time.Second))
	time.Sleep(100 * time.Millisecond)
	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-waiter
	if got.err != nil {
		t.Fatalf("later waiter, key free since %v: %v", time.Since(released), got.err)
	}
	if d := got.at.Sub(released); d > time.Second {
		t.Errorf("later waiter granted %v after the release", d)
	}
	_ = got.lease.Release(ctx)
	_ = heldOther.Release(ctx)
	if o := <-otherWaiter; o.err == nil {
		_ = o.lease.Release(ctx)
	}
}

// A SUBSCRIBE that fails once (the subscription's connection never
// answers its handshake) while Redis answers commands is weather, not an
// outage: the plain waiters lined up behind the waiter that sent it are
// all granted in turn once the key frees.
func TestFailedSubscribeDoesNotEndTheLine(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	p := newProxy(t, addr)
	holder := newLocker(t, newClient(t, addr))
	c := redis.NewClient(&redis.Options{Addr: p.addr, ContextTimeoutEnabled: true, ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { c.Close() })
	l := newLocker(t, c)
	ctx := context.Background()
	key := uniqueKey(t)

	// The command connection opens before the stall, the subscription's
	// (opened by the first waiter) during it.
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	held := hold(t, holder, key)
	p.stall(true)
	var waiters []<-chan acquired
	for range 3 {
		waiters = append(waiters, acquireAsync(l, ctx, key, lockkit.WithWaitTimeout(20*time.Second)))
		time.Sleep(50 * time.Millisecond) // in line in this order, behind the SUBSCRIBE
	}
	// go-redis's own dial may go first: two handshakes time out by then.
	time.Sleep(600 * time.Millisecond)
	p.stall(false)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i, w := range waiters {
		select {
		case got := <-w:
			if got.err != nil {
				t.Fatalf("waiter %d, one SUBSCRIBE failed on a Redis that answers commands: %v", i, got.err)
			}
			_ = got.lease.Release(ctx)
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d still waits after one failed SUBSCRIBE", i)
		}
	}
}

// While the subscription's connection cannot be opened at all (a server
// that accepts it and never answers), go-redis's own reconnect holds the
// PubSub for its dial and handshake timeouts, seconds, and tries again at
// once. A waiter whose key is unheard still looks every unheardPoll, as
// promised: it must not wait behind that to send the SUBSCRIBE again.
func TestUnheardWaiterGrantedWhileSubscriptionCannotOpen(t *testing.T) {
	p, l, holder := stalledSubscription(t)
	ctx := context.Background()
	key := uniqueKey(t)
	held := hold(t, holder, key)
	defer p.stall(false) // before the Locker's Close
	waiter := acquireAsync(l, ctx, key, lockkit.WithWaitTimeout(30*time.Second))
	time.Sleep(time.Second) // its SUBSCRIBE goes nowhere
	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-waiter
	if got.err != nil {
		t.Fatalf("waiter on a Redis that answers commands: %v", got.err)
	}
	_ = got.lease.Release(ctx)
	// A look every 200 ms; the bound leaves room for a loaded machine, and
	// waiting behind go-redis takes many seconds.
	if d := got.at.Sub(released); d > 3*time.Second {
		t.Errorf("unheard waiter granted %v after the release; want within about %v", d, 200*time.Millisecond)
	}
}

// A wait timeout holds while the subscription's connection cannot be
// opened, for the waiters of every key: none of them may wait for a
// SUBSCRIBE or an UNSUBSCRIBE to get through, its own or another key's.
func TestWaitTimeoutKeptWhileSubscriptionCannotOpen(t *testing.T) {
	// The slack leaves room for a loaded machine; a wait behind go-redis's
	// reconnect takes many seconds.
	const timeout, slack = 150 * time.Millisecond, 2 * time.Second
	p, l, holder := stalledSubscription(t)
	ctx := context.Background()
	key := uniqueKey(t)
	hold(t, holder, key)
	defer p.stall(false)
	otherCtx, cancel := context.WithCancel(ctx)
	other := acquireAsync(l, otherCtx, key, lockkit.WithWaitTimeout(30*time.Second))
	time.Sleep(time.Second) // its key unheard
	for i := range 3 {
		k := fmt.Sprintf("%s-%d", key, i)
		hold(t, holder, k)
		start := time.Now()
		_, err := l.Acquire(ctx, k, lockkit.WithWaitTimeout(timeout))
		if d := time.Since(start); d > timeout+slack {
			t.Errorf("waiter %d with a %v wait timeout returned after %v (%v)", i, timeout, d, err)
		} else if !errors.Is(err, lockkit.ErrNotAcquired) {
			t.Errorf("waiter %d: %v, want ErrNotAcquired", i, err)
		}
	}
	cancel()
	if got := <-other; !errors.Is(got.err, context.Canceled) {
		t.Errorf("waiter on the unheard key: %v, want context.Canceled", got.err)
	}
}

// Close ends the waits of unheard keys at once while the subscription's
// connection cannot be opened, and leaves nothing behind.
func TestCloseEndsUnheardWaitsAtOnce(t *testing.T) {
	p, l, holder := stalledSubscription(t)
	baseline := goleak.IgnoreCurrent()
	ctx := context.Background()
	key := uniqueKey(t)
	hold(t, holder, key)
	hold(t, holder, key+"-other")
	defer p.stall(false)
	waiters := []<-chan acquired{acquireAsync(l, ctx, key, lockkit.WithWaitTimeout(30*time.Second)),
		acquireAsync(l, ctx, key+"-other", lockkit.WithWaitTimeout(30*time.Second))}
	time.Sleep(time.Second) // their keys unheard
	start := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- l.Close() }()
	for i, w := range waiters {
		if got := <-w; !errors.Is(got.err, lockkit.ErrClosed) {
			t.Errorf("waiter %d of a closed Locker: %v", i, got.err)
		} else if d := got.at.Sub(start); d > 2*time.Second {
			t.Errorf("waiter %d ended %v after Close", i, d)
		}
	}
	p.stall(false) // Close waits for go-redis's own reconnect
	<-closed
	goleak.VerifyNone(t, baseline)
}

// stalledSubscription is a Locker whose command connection works and whose
// subscription's connection, opened by its first waiter, never will
// (proxy.stall), nor will any other new connection, and a Locker that
// reaches Redis directly. The client has
// go-redis's default timeouts, as the service's (cmd/shop).
func stalledSubscription(t *testing.T) (*proxy, *redislock.Locker, *redislock.Locker) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	p := newProxy(t, addr)
	c := newClient(t, p.addr)
	// Open a few command connections first, for the commands of waiters
	// that happen to run at once.
	ctx := context.Background()
	var conns []*redis.Conn
	for range 4 {
		conn := c.Conn()
		if err := conn.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		conns = append(conns, conn)
	}
	for _, conn := range conns {
		conn.Close()
	}
	p.stall(true)
	return p, newLocker(t, c), newLocker(t, newClient(t, addr))
}

// A waiter whose subscription connection is cut, and which so misses the
// release message, is granted once the subscription is back, not when the
// holder's TTL would have run out.
func TestWaiterGrantedAfterSubscriptionKilled(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	p := newProxy(t, addr)
	holder := newLocker(t, newClient(t, addr))
	l := newLocker(t, newClient(t, p.addr))
	key := uniqueKey(t)
	ctx := context.Background()

	held := hold(t, holder, key)
	waiter := acquireAsync(l, ctx, key, lockkit.WithWaitTimeout(20*time.Second))
	time.Sleep(200 * time.Millisecond)

	p.freeze(true) // the resubscription waits until after the release
	p.killSubscribers()
	released := time.Now()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	p.freeze(false)
	got := <-waiter
	if got.err != nil {
		t.Fatal(got.err)
	}
	if d := got.at.Sub(released); d > 2*time.Second {
		t.Errorf("waiter granted %v after the release", d)
	}
	_ = got.lease.Release(ctx)
}

// A waiter cancelled while Redis is black-holed returns within its deadline
// and a small bound: it must not wait for its own clean-up.
func TestCancelAgainstBlackholedRedis(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	const budget, slack = 300 * time.Millisecond, 250 * time.Millisecond
	t.Run("waiting", func(t *testing.T) {
		p := newProxy(t, addr)
		holder := newLocker(t, newClient(t, addr))
		l := newLocker(t, newClient(t, p.addr))
		key := uniqueKey(t)
		held := hold(t, holder, key)
		defer held.Release(context.Background())

		ctx, cancel := context.WithCancel(context.Background())
		waiter := acquireAsync(l, ctx, key)
		time.Sleep(200 * time.Millisecond)
		p.blackhole(true)
		cancelled := time.Now()
		cancel()
		got := <-waiter
		if !errors.Is(got.err, context.Canceled) {
			t.Fatalf("cancelled waiter: %v", got.err)
		}
		if d := got.at.Sub(cancelled); d > slack {
			t.Errorf("cancelled waiter returned after %v", d)
		}
	})
	t.Run("arriving", func(t *testing.T) {
		p := newProxy(t, addr)
		l := newLocker(t, newClient(t, p.addr))
		key := uniqueKey(t)
		p.blackhole(true)
		ctx, cancel := context.WithTimeout(context.Background(), budget)
		defer cancel()
		start := time.Now()
		_, err := l.Acquire(ctx, key)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("acquire against a black hole: %v", err)
		}
		if d := time.Since(start); d > budget+slack {
			t.Errorf("acquire with a %v budget returned after %v", budget, d)
		}
	})
}

// Close racing contended Acquires leaves no goroutine and no connection
// behind, while the client (the caller's) stays open.
func TestCloseRacingAcquireLeaksNothing(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	holder := newLocker(t, newClient(t, addr))
	client := newClient(t, addr)
	if err := client.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	key := uniqueKey(t)
	held := hold(t, holder, key)
	defer held.Release(context.Background())
	baseline := goleak.IgnoreCurrent()

	for range 40 {
		l, err := redislock.New(client, redislock.WithPrefix(testPrefix))
		if err != nil {
			t.Fatal(err)
		}
		waiters := []<-chan acquired{acquireAsync(l, context.Background(), key),
			acquireAsync(l, context.Background(), key)}
		time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
		_ = l.Close()
		for _, w := range waiters {
			if got := <-w; !errors.Is(got.err, lockkit.ErrClosed) {
				t.Fatalf("waiter of a closed Locker: %v", got.err)
			}
		}
	}
	goleak.VerifyNone(t, baseline)
	if n := client.PoolStats().PubSubStats.Active; n != 0 {
		t.Errorf("%d subscription connections open after every Locker closed", n)
	}
}

// An owner whose lease ran out, and whose key another process then took,
// must not be handed a nested lease of the dead grant by Reentrant: two
// holders at once. Reentrant asks the lease's Lost with a select and a
// default; nobody had looked at Lost before.
func TestReentrantDoesNotNestAnExpiredLease(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	ctx := context.Background()
	l := lockkit.Reentrant(newLocker(t, newClient(t, addr)))
	other := newLocker(t, newClient(t, addr))
	key := uniqueKey(t)
	alice := lockkit.WithOwner(ctx, "alice")

	outer, err := l.TryAcquire(alice, key, lockkit.WithTTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Release(ctx)
	time.Sleep(200 * time.Millisecond) // the TTL runs out
	theirs, err := other.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("key free after the TTL, yet: %v", err)
	}
	defer theirs.Release(ctx)
	nested, err := l.TryAcquire(alice, key, lockkit.WithTTL(time.Minute))
	if err == nil {
		defer nested.Release(ctx)
		t.Fatal("alice was given a nested lease of her expired grant while another process holds the key")
	}
	if !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("alice's TryAcquire of a key another holds = %v, want ErrNotAcquired", err)
	}
}
