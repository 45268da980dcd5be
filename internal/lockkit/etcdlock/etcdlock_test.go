package etcdlock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"runtime"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/testenv"
)

const (
	// The server's minimum lease TTL with default settings.
	sessionTTL = 2 * time.Second
	testPrefix = "/shop/test/etcdlock/"
)

func TestConformance(t *testing.T) {
	runConformance(t, serverEndpoints(t))
}

// runConformance runs the suite on the etcd at endpoints (one member or a
// cluster).
func runConformance(t *testing.T, endpoints []string) {
	locktest.Run(t, locktest.Harness{
		New: func(t testing.TB) lockkit.Locker { return open(t, endpoints) },
		Wired: func(t testing.TB, w *locktest.Wire) lockkit.Locker {
			proxied := make([]string, len(endpoints))
			for i, e := range endpoints {
				proxied[i] = w.Proxy(e)
			}
			return open(t, proxied)
		},
		// An operator deletes the holder's key, through a client of its
		// own, whose calls may reach another member than the holder's.
		Steal: func(t testing.TB, key string) {
			c := dial(t, endpoints)
			ctx := context.Background()
			resp, err := c.Get(ctx, dir(key), clientv3.WithFirstCreate()...)
			if err != nil || len(resp.Kvs) == 0 {
				t.Fatalf("no key to steal for %q: %v", key, err)
			}
			if _, err := c.Delete(ctx, string(resp.Kvs[0].Key)); err != nil {
				t.Fatal(err)
			}
		},
		TTL:        300 * time.Millisecond,
		CrashSlack: sessionTTL,
	})
}

// Losing the session (its lease revoked, as an expiry would) loses every
// lease on it at the next renewal; the Locker goes on with a new session.
func TestSessionLossClosesLost(t *testing.T) {
	endpoints := serverEndpoints(t)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	a, b := open(t, endpoints), open(t, endpoints)
	la := try(t, a, key, lockkit.WithTTL(time.Minute))
	if _, err := dial(t, endpoints).Revoke(ctx, a.session.id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-la.Lost():
	case <-time.After(sessionTTL):
		t.Fatal("Lost still open a session TTL after the session's lease was revoked")
	}
	lb := try(t, b, key)
	if lb.Fence() <= la.Fence() {
		t.Fatalf("fence %d after the loss, not above %d", lb.Fence(), la.Fence())
	}
	_ = lb.Release(ctx)
	la2 := try(t, a, key)
	_ = la2.Release(ctx)
}

// etcd issue 11456: a waiter whose own key went away with its lease must
// not come back as the holder when the keys ahead of it are gone. Here it
// requeues with a new session and is granted only after the holder
// releases.
func TestWaiterWithoutItsKeyIsNotGranted(t *testing.T) {
	endpoints := serverEndpoints(t)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	a, b := open(t, endpoints), open(t, endpoints)
	la := try(t, a, key, lockkit.WithTTL(time.Minute))
	granted := make(chan lockkit.Lease, 1)
	go func() {
		lb, err := b.Acquire(ctx, key, lockkit.WithTTL(time.Minute))
		if err != nil {
			t.Error(err)
		}
		granted <- lb
	}()
	c := dial(t, endpoints)
	waitFor(t, func() bool { return queueLen(t, c, key) == 2 })
	if _, err := c.Revoke(ctx, b.session.id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-granted:
		t.Fatal("the waiter was granted while the holder still held the key")
	case <-time.After(sessionTTL):
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case lb := <-granted:
		if lb.Fence() <= la.Fence() {
			t.Fatalf("fence %d not above the holder's %d", lb.Fence(), la.Fence())
		}
		_ = lb.Release(ctx)
	case <-time.After(5 * time.Second):
		t.Fatal("the requeued waiter was not granted after the release")
	}
}

// A TryAcquire that finds the key held leaves nothing behind when it
// returns: a key of its own still queued would sit ahead of the caller's
// next TryAcquire, which would then be refused a free lock.
func TestRefusedTryLeavesNoKeyBehind(t *testing.T) {
	endpoints := serverEndpoints(t)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	a, b := open(t, endpoints), open(t, endpoints)
	c := dial(t, endpoints)
	for i := range 20 {
		la := try(t, a, key, lockkit.WithTTL(time.Minute))
		if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
			t.Fatalf("round %d: TryAcquire of a held key = %v, want ErrNotAcquired", i, err)
		}
		if n := queueLen(t, c, key); n != 1 {
			t.Fatalf("round %d: %d keys queued after the refused TryAcquire returned, want only the holder's", i, n)
		}
		if err := la.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lb, err := b.TryAcquire(ctx, key)
		if err != nil {
			t.Fatalf("round %d: TryAcquire of a free key: %v", i, err)
		}
		if err := lb.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// A free lock costs what concurrency.Mutex pays: one Txn to acquire, one
// Delete to release. Counted at the client's KV, not timed.
func TestUncontendedCycleIsTwoRoundTrips(t *testing.T) {
	c := dial(t, serverEndpoints(t))
	kv := &countingKV{KV: c.KV}
	c.KV = kv
	l, err := FromClient(c, WithPrefix(testPrefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	const cycles = 20
	kv.reset()
	for range cycles {
		lease, err := l.Acquire(ctx, key, lockkit.WithTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := kv.snapshot(), map[string]int{"Txn": cycles, "Delete": cycles}; !maps.Equal(got, want) {
		t.Fatalf("%d uncontended cycles made %v, want %v", cycles, got, want)
	}
}

// Held leases cost no goroutine each: a session's loss reaches its leases
// through one goroutine per session.
func TestHeldLeasesStartNoGoroutines(t *testing.T) {
	l := open(t, serverEndpoints(t))
	ctx := context.Background()
	const held = 20
	before := runtime.NumGoroutine()
	var leases []lockkit.Lease
	for i := range held {
		leases = append(leases, try(t, l, fmt.Sprintf("etcdlock:test:%s:%d", t.Name(), i), lockkit.WithTTL(time.Minute)))
	}
	if grown := runtime.NumGoroutine() - before; grown >= held/2 {
		t.Errorf("%d goroutines more while %d leases are held", grown, held)
	}
	for _, lease := range leases {
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Close ends the session, and with it every lease still held: their Lost
// is closed by the time Close returns.
func TestCloseClosesLostOfHeldLeases(t *testing.T) {
	l := open(t, serverEndpoints(t))
	lease := try(t, l, "etcdlock:test:"+t.Name(), lockkit.WithTTL(time.Minute))
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Lost():
	default:
		t.Fatal("Lost still open after Close returned")
	}
	if err := lease.Release(context.Background()); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("Release after Close = %v, want ErrNotHeld", err)
	}
}

// An acquisition that finds a key under its own name (a deletion we thought
// done) must not queue behind itself: it drops that key and is granted.
func TestOwnNameFoundIsNotQueuedBehind(t *testing.T) {
	endpoints := serverEndpoints(t)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	l := open(t, endpoints)
	c := dial(t, endpoints)
	stale := fmt.Sprintf("%s%016x-0", dir(key), l.session.id)
	if _, err := c.Put(ctx, stale, "", clientv3.WithLease(l.session.id)); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lease, err := l.Acquire(waitCtx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire with a stale key under our own name: %v", err)
	}
	if n := queueLen(t, c, key); n != 1 {
		t.Fatalf("%d keys queued while granted, want only ours", n)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// Why each acquisition has a key of its own: concurrency.Mutex names its
// key after the session, so two goroutines sharing a session both "hold"
// the lock.
func TestPeerMutexExcludesNothingWithinASession(t *testing.T) {
	c := dial(t, serverEndpoints(t))
	s, err := concurrency.NewSession(c, concurrency.WithTTL(int(sessionTTL.Seconds())))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	pfx := testPrefix + "peer/" + t.Name()
	first, second := concurrency.NewMutex(s, pfx), concurrency.NewMutex(s, pfx)
	if err := first.Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := second.Lock(ctx); err != nil {
		t.Fatalf("second Lock on the same session: %v (the peer now excludes: update the docs)", err)
	}
	_ = first.Unlock(ctx)
}

// Keys are escaped: "a/b" is not queued under "a".
func TestKeysAreEscaped(t *testing.T) {
	l := open(t, serverEndpoints(t))
	ctx := context.Background()
	base := "etcdlock:test:" + t.Name()
	for _, k := range []string{base, base + "/b", base + "/", ""} {
		lease := try(t, l, k, lockkit.WithTTL(time.Minute))
		defer lease.Release(ctx)
	}
}

func BenchmarkUncontended(b *testing.B) {
	endpoints := serverEndpoints(b)
	ctx := context.Background()
	// A key of its own per run: history left under a key by earlier runs
	// (etcd keeps deleted names until compaction) must not be measured.
	key := "bench-" + rand.Text()
	b.Run("etcdlock", func(b *testing.B) {
		l := open(b, endpoints)
		for b.Loop() {
			lease, err := l.Acquire(ctx, key)
			if err != nil {
				b.Fatal(err)
			}
			if err := lease.Release(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("concurrency-mutex", func(b *testing.B) {
		s, err := concurrency.NewSession(dial(b, endpoints))
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		m := concurrency.NewMutex(s, testPrefix+"peer/"+key)
		for b.Loop() {
			if err := m.Lock(ctx); err != nil {
				b.Fatal(err)
			}
			if err := m.Unlock(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("round-trip", func(b *testing.B) {
		c := dial(b, endpoints)
		for b.Loop() {
			if _, err := c.Get(ctx, testPrefix); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func serverEndpoints(t testing.TB) []string {
	return testenv.RequireList(t, "SHOP_TEST_ETCD_ENDPOINTS")
}

func open(t testing.TB, endpoints []string) *Locker {
	t.Helper()
	l, err := New(endpoints, WithPrefix(testPrefix), WithSessionTTL(sessionTTL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func dial(t testing.TB, endpoints []string) *clientv3.Client {
	t.Helper()
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func dir(key string) string { return testPrefix + url.PathEscape(key) + "/" }

func queueLen(t testing.TB, c *clientv3.Client, key string) int64 {
	resp, err := c.Get(context.Background(), dir(key), clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
	}
}

func try(t testing.TB, l lockkit.Locker, key string, opts ...lockkit.Option) lockkit.Lease {
	t.Helper()
	lease, err := l.TryAcquire(context.Background(), key, opts...)
	if err != nil {
		t.Fatalf("TryAcquire %s: %v", key, err)
	}
	return lease
}

// countingKV counts the calls made through a client's KV.
type countingKV struct {
	clientv3.KV
	mu    sync.Mutex
	calls map[string]int
}

func (k *countingKV) count(name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.calls == nil {
		k.calls = map[string]int{}
	}
	k.calls[name]++
}

func (k *countingKV) reset() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.calls = map[string]int{}
}

func (k *countingKV) snapshot() map[string]int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return maps.Clone(k.calls)
}

func (k *countingKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	k.count("Put")
	return k.KV.Put(ctx, key, val, opts...)
}

func (k *countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.count("Get")
	return k.KV.Get(ctx, key, opts...)
}

func (k *countingKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	k.count("Delete")
	return k.KV.Delete(ctx, key, opts...)
}

func (k *countingKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	k.count("Do")
	return k.KV.Do(ctx, op)
}

func (k *countingKV) Txn(ctx context.Context) clientv3.Txn {
	k.count("Txn")
	return k.KV.Txn(ctx)
}
