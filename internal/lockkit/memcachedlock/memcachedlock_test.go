package memcachedlock_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/lockkit/memcachedlock"
	"github.com/lockbench/shop/internal/testenv"
)

// Every lease's keeper and every Locker's goroutines end by the time the
// tests do.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	addr := serverAddr(t)
	locktest.Run(t, locktest.Harness{
		New: func(t testing.TB) lockkit.Locker { return memcachedlock.New(dial(t, addr)) },
		Wired: func(t testing.TB, w *locktest.Wire) lockkit.Locker {
			return memcachedlock.New(dial(t, w.Proxy(addr)))
		},
		Steal: func(t testing.TB, key string) {
			if err := dial(t, addr).Delete(memcachedlock.ItemKey(key)); err != nil {
				t.Fatal(err)
			}
		},
		// Whole seconds are all memcached can count; an item outlives its
		// lease by up to one more second, its clock's granularity.
		TTL:        time.Second,
		CrashSlack: time.Second,
	})
}

// The release is a cas to an already expired item: on a real memcached it
// must leave the key free for the next add, and no trace for a get.
func TestReleaseFreesTheItem(t *testing.T) {
	ctx := context.Background()
	mc := dial(t, serverAddr(t))
	l := memcachedlock.New(mc)
	defer l.Close()
	key := "memcachedlock:test:" + t.Name()

	lease, err := l.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := mc.Get(key); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("get after release = %v, want a cache miss", err)
	}
	again, err := l.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("TryAcquire right after release: %v", err)
	}
	_ = again.Release(ctx)
}

// A Release whose caller left still frees the item in the background; a
// retry after that release has run is answered by it, not by the server,
// which no longer holds the item and would say not held.
func TestReleaseRetriedAfterItsBackgroundReleaseRanSucceeds(t *testing.T) {
	mc := dial(t, serverAddr(t))
	l := memcachedlock.New(mc)
	defer l.Close()
	key := "memcachedlock:test:" + t.Name()

	ended, cancel := context.WithCancel(context.Background())
	cancel()
	// The caller's Release races its own background call; take a lease
	// whose first Release lost that race.
	var lease lockkit.Lease
	for range 100 {
		l1, err := l.TryAcquire(context.Background(), key, lockkit.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if l1.Release(ended) != nil {
			lease = l1
			break
		}
	}
	if lease == nil {
		t.Fatal("100 Releases with an ended context all answered nil")
	}
	deadline := time.Now().Add(10 * time.Second)
	for _, err := mc.Get(key); !errors.Is(err, memcache.ErrCacheMiss); _, err = mc.Get(key) {
		if time.Now().After(deadline) {
			t.Fatalf("the item is still there 10 s after a release whose caller left: %v", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("Release retried after its background release freed the item = %v, want nil", err)
	}
}

// Extend and Release by a holder whose item was replaced change nothing.
func TestOwnerCheckedAfterTakeover(t *testing.T) {
	ctx := context.Background()
	mc := dial(t, serverAddr(t))
	l := memcachedlock.New(mc)
	defer l.Close()
	key := "memcachedlock:test:" + t.Name()

	lease, err := l.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if err := mc.Set(&memcache.Item{Key: key, Value: []byte("intruder"), Expiration: 60}); err != nil {
		t.Fatal(err)
	}
	defer mc.Delete(key)
	if err := lease.Extend(ctx, time.Minute); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("Extend of a replaced item = %v, want ErrNotHeld", err)
	}
	if err := lease.Release(ctx); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("Release of a replaced item = %v, want ErrNotHeld", err)
	}
	it, err := mc.Get(key)
	if err != nil || string(it.Value) != "intruder" {
		t.Fatalf("after a non-owner's release the item is %v (%v), want the intruder's", it, err)
	}
}

// An add still waiting for its answer when its caller gives up goes on in
// the background; an item it stored then is taken back, not left to block
// the key for a whole lease.
func TestAbandonedAddGivesBackItsItem(t *testing.T) {
	ctx := context.Background()
	addr := serverAddr(t)
	key := "memcachedlock:test:" + t.Name()
	w := locktest.NewWire(t)
	l := memcachedlock.New(dial(t, w.Proxy(addr)))
	w.HoldReplies() // the add is stored, its answer waits
	tryCtx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if lease, err := l.TryAcquire(tryCtx, key, lockkit.WithTTL(time.Minute)); !errors.Is(err, context.DeadlineExceeded) {
		if lease != nil {
			_ = lease.Release(ctx)
		}
		t.Fatalf("TryAcquire whose context ended while the add's answer was held = %v, want its deadline's error", err)
	}
	w.Heal()
	_ = l.Close() // waits for the add and its undoing
	if _, err := dial(t, addr).Get(key); !errors.Is(err, memcache.ErrCacheMiss) {
		t.Fatalf("get after the abandoned add = %v, want a cache miss: the item blocks the key for its lease", err)
	}
}

// Keys memcached would refuse (too long, spaces) still lock, under a hash.
func TestIllegalKeys(t *testing.T) {
	ctx := context.Background()
	addr := serverAddr(t)
	a, b := memcachedlock.New(dial(t, addr)), memcachedlock.New(dial(t, addr))
	defer a.Close()
	defer b.Close()
	for _, key := range []string{
		"memcachedlock:test:with spaces",
		"memcachedlock:test:" + strings.Repeat("x", 300),
	} {
		la, err := a.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
		if err != nil {
			t.Fatalf("TryAcquire %.40q: %v", key, err)
		}
		if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
			t.Fatalf("second TryAcquire %.40q = %v, want ErrNotAcquired", key, err)
		}
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

func TestServerDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	_ = ln.Close()
	l := memcachedlock.New(dial(t, addr))
	defer l.Close()
	if _, err := l.TryAcquire(context.Background(), "memcachedlock:test:down"); !errors.Is(err, lockkit.ErrUnavailable) {
		t.Fatalf("TryAcquire with no server = %v, want ErrUnavailable", err)
	}
	// Acquire does not wait for ever on a server that is not there.
	if _, err := l.Acquire(context.Background(), "memcachedlock:test:down"); !errors.Is(err, lockkit.ErrUnavailable) {
		t.Fatalf("Acquire with no server = %v, want ErrUnavailable", err)
	}
}

// memcached keeps an item at most 30 days (a longer relative expiry would
// be read as a Unix time): an Extend asking for more is capped there, held
// by the server and trusted by the lease for no longer.
func TestExtendBeyondThirtyDaysIsCapped(t *testing.T) {
	ctx := context.Background()
	mc := dial(t, serverAddr(t))
	l := memcachedlock.New(mc)
	defer l.Close()
	key := "memcachedlock:test:" + t.Name()
	lease, err := l.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	if err := lease.Extend(ctx, 960*time.Hour); err != nil {
		t.Fatalf("Extend(960h): %v", err)
	}
	answered := time.Now()
	const kept = 30 * 24 * time.Hour
	if got := deadline(t, lease); got.After(answered.Add(kept)) {
		t.Errorf("Extend(960h) trusted for %v; memcached keeps an item %v at most", got.Sub(answered), kept)
	}
	other := memcachedlock.New(mc)
	defer other.Close()
	if _, err := other.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Errorf("another owner's add after the capped Extend = %v, want ErrNotAcquired: the item must still be held", err)
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

func serverAddr(t testing.TB) string { return testenv.Require(t, "SHOP_TEST_MEMCACHED_ADDR") }

func dial(t testing.TB, addr string) *memcache.Client {
	mc := memcache.New(addr)
	t.Cleanup(func() { _ = mc.Close() })
	return mc
}
