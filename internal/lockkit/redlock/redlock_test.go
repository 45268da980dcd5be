package redlock_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/lockkit/redlock"
	"github.com/lockbench/shop/internal/testenv"
)

// Every lease's keeper and every Locker's goroutines end by the time the
// tests do.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ttl = 300 * time.Millisecond

func TestConformance(t *testing.T) {
	addrs := masterAddrs(t)
	locktest.Run(t, locktest.Harness{
		New: func(t testing.TB) lockkit.Locker { return redlock.New(dial(t, addrs)) },
		Wired: func(t testing.TB, w *locktest.Wire) lockkit.Locker {
			proxied := make([]string, len(addrs))
			for i, a := range addrs {
				proxied[i] = w.Proxy(a)
			}
			return redlock.New(dial(t, proxied))
		},
		// An operator deleting the lock deletes it everywhere.
		Steal: func(t testing.TB, key string) {
			for _, c := range dial(t, addrs) {
				if err := c.Del(context.Background(), key).Err(); err != nil {
					t.Fatal(err)
				}
			}
		},
		TTL: ttl,
	})
}

// A lock over three masters keeps working, and keeps excluding, while one
// master does not answer.
func TestOneMasterDown(t *testing.T) {
	addrs := masterAddrs(t)
	var resume time.Time // when the paused master answers again
	cases := []struct {
		name string
		down func(t *testing.T) []string
	}{
		{"closed-port", func(t *testing.T) []string { return []string{addrs[0], addrs[1], closedAddr(t)} }},
		{"paused", func(t *testing.T) []string {
			// CLIENT PAUSE WRITE holds SET and EVAL for longer than an
			// operation's timeout: the master is alive but silent, the
			// harder case for a client.
			pause := dial(t, addrs[2:])[0]
			resume = time.Now().Add(time.Second)
			if err := pause.Do(context.Background(), "CLIENT", "PAUSE", 1000, "WRITE").Err(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { pause.Do(context.Background(), "CLIENT", "UNPAUSE") })
			return addrs
		}},
	}
	const ttl = 2 * time.Second // each operation may wait 100 ms on the silent master
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			key := "redlock:test:" + t.Name()
			clients := tc.down(t)
			a, b := redlock.New(dial(t, clients)), redlock.New(dial(t, clients))
			defer a.Close()
			defer b.Close()

			la, err := a.TryAcquire(ctx, key, lockkit.WithTTL(ttl))
			if err != nil {
				t.Fatalf("TryAcquire with 2 of 3 masters: %v", err)
			}
			if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
				t.Fatalf("second TryAcquire = %v, want ErrNotAcquired", err)
			}
			if err := la.Extend(ctx, ttl); err != nil {
				t.Fatalf("Extend with 2 of 3 masters: %v", err)
			}
			if err := la.Release(ctx); err != nil {
				t.Fatalf("Release with 2 of 3 masters: %v", err)
			}
			lb, err := b.TryAcquire(ctx, key, lockkit.WithTTL(ttl))
			if err != nil {
				t.Fatalf("TryAcquire after release: %v", err)
			}
			if err := lb.Release(ctx); err != nil {
				t.Fatalf("Release: %v", err)
			}
			// Once the silent master speaks again, none of the requests
			// it missed may have left a value behind.
			time.Sleep(time.Until(resume) + 50*time.Millisecond)
			for i, c := range dial(t, addrs) {
				if n := c.Exists(ctx, key).Val(); n != 0 {
					t.Fatalf("master %d still holds the key after every lease was released", i)
				}
			}
		})
	}
}

// Without a majority nobody gets the lock, and the caller is told the
// servers are at fault rather than another holder.
func TestTwoMastersDown(t *testing.T) {
	ctx := context.Background()
	addrs := masterAddrs(t)
	key := "redlock:test:" + t.Name()
	alive := dial(t, addrs[:1])[0]
	l := redlock.New(append(dial(t, []string{closedAddr(t), closedAddr(t)}), alive))
	defer l.Close()

	if _, err := l.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrUnavailable) {
		t.Fatalf("TryAcquire with 1 of 3 masters = %v, want ErrUnavailable", err)
	}
	// Acquire does not wait for ever for a majority that is not there.
	if _, err := l.Acquire(ctx, key); !errors.Is(err, lockkit.ErrUnavailable) {
		t.Fatalf("Acquire with 1 of 3 masters = %v, want ErrUnavailable", err)
	}
	// The minority grant on the live master was undone, so it blocks no one.
	if n := alive.Exists(ctx, key).Val(); n != 0 {
		t.Fatalf("the failed attempt left its value on the live master")
	}
}

// A failed attempt takes back what it got on a minority, so that the
// masters it did win do not turn away the next contender for a whole TTL.
func TestMinorityGrantUndone(t *testing.T) {
	ctx := context.Background()
	addrs := masterAddrs(t)
	key := "redlock:test:" + t.Name()
	clients := dial(t, addrs)
	for _, c := range clients[:2] {
		if err := c.Set(ctx, key, "someone-else", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	defer clients[0].Del(ctx, key)
	defer clients[1].Del(ctx, key)
	l := redlock.New(clients)
	defer l.Close()

	if _, err := l.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("TryAcquire against a majority holder = %v, want ErrNotAcquired", err)
	}
	if n := clients[2].Exists(ctx, key).Val(); n != 0 {
		t.Fatal("the losing attempt kept the third master")
	}
}

// An attempt still running when its caller gives up goes on in the
// background; a majority it wins then is given back, not kept for a TTL.
func TestAbandonedAttemptGivesBackItsGrant(t *testing.T) {
	ctx := context.Background()
	addrs := masterAddrs(t)
	key := "redlock:test:" + t.Name()
	clients := dial(t, addrs)
	// Each master holds the attempt's SET for 300 ms, well inside the
	// attempt's 1 s operation timeout (20 s TTL), and then grants it.
	for _, c := range clients {
		if err := c.Do(ctx, "CLIENT", "PAUSE", 300, "WRITE").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Do(context.Background(), "CLIENT", "UNPAUSE") })
	}
	l := redlock.New(dial(t, addrs))
	waitCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if lease, err := l.Acquire(waitCtx, key, lockkit.WithTTL(20*time.Second)); !errors.Is(err, context.DeadlineExceeded) {
		if lease != nil {
			_ = lease.Release(ctx)
		}
		t.Fatalf("Acquire whose context ended while the masters held its SETs = %v, want its deadline's error", err)
	}
	_ = l.Close() // waits for the attempt
	for i, c := range clients {
		if n := c.Exists(ctx, key).Val(); n != 0 {
			t.Fatalf("master %d kept the grant of an attempt whose caller had left", i)
		}
	}
}

// Release and Extend after the key was taken by another owner on every
// master change nothing and report ErrNotHeld.
func TestOwnerCheckedAfterTakeover(t *testing.T) {
	ctx := context.Background()
	addrs := masterAddrs(t)
	key := "redlock:test:" + t.Name()
	clients := dial(t, addrs)
	l := redlock.New(clients)
	defer l.Close()

	lease, err := l.TryAcquire(ctx, key, lockkit.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range clients {
		c.Set(ctx, key, "intruder", time.Minute)
		defer c.Del(ctx, key)
	}
	if err := lease.Extend(ctx, time.Minute); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("Extend of a taken-over key = %v, want ErrNotHeld", err)
	}
	if err := lease.Release(ctx); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("Release of a taken-over key = %v, want ErrNotHeld", err)
	}
	for i, c := range clients {
		if v := c.Get(ctx, key).Val(); v != "intruder" {
			t.Fatalf("master %d holds %q after a non-owner's release, want the intruder's value", i, v)
		}
	}
}

// An Extend, and so every watchdog renewal, is trusted for what redsync's
// validity says after it: the TTL less the clock-drift allowance the grant
// charges, counted from before the request left.
func TestExtendChargesTheGrantsDriftAllowance(t *testing.T) {
	l := redlock.New(dial(t, masterAddrs(t)))
	defer l.Close()
	ctx := context.Background()
	const ttl = 4 * time.Second
	drift := ttl / 100 // redsync's default drift factor
	lease, err := l.Acquire(ctx, "redlock:test:"+t.Name(), lockkit.WithTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	granted := time.Now()
	if got, limit := deadline(t, lease), granted.Add(ttl-drift); got.After(limit) {
		t.Errorf("grant trusted for %v after its answer, want at most %v", got.Sub(granted), ttl-drift)
	}
	if err := lease.Extend(ctx, ttl); err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	if got, limit := deadline(t, lease), answered.Add(ttl-drift); got.After(limit) {
		t.Errorf("Extend trusted for %v after its answer, want at most %v", got.Sub(answered), ttl-drift)
	}
}

// deadline is when lease's Lost closes unless a renewal moves it.
func deadline(t *testing.T, lease lockkit.Lease) time.Time {
	t.Helper()
	d, ok := lease.(interface{ Deadline() time.Time })
	if !ok {
		t.Fatalf("%T reports no deadline", lease)
	}
	return d.Deadline()
}

func masterAddrs(t testing.TB) []string {
	t.Helper()
	addrs := testenv.RequireList(t, "SHOP_TEST_REDLOCK_ADDRS")
	if len(addrs) < 3 {
		t.Fatalf("SHOP_TEST_REDLOCK_ADDRS lists %d masters, the tests need 3", len(addrs))
	}
	return addrs[:3]
}

// dial opens one client per address, closed when t ends. Retries are off
// and ctx deadlines bound every call: a silent master must cost one
// attempt's timeout, not the client's own.
func dial(t testing.TB, addrs []string) []redis.UniversalClient {
	clients := make([]redis.UniversalClient, len(addrs))
	for i, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		clients[i] = c
	}
	return clients
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t testing.TB) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	return addr
}
