package zklock

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/testenv"
)

const (
	// The server's minSessionTimeout is 1 s, but it checks expiries once a
	// tickTime (2 s): a dead client's nodes may live up to about 6 s. Not
	// shorter: on a loaded machine a 2 s session (1.3 s read timeout) makes
	// clients reconnect in tests that mean to test something else.
	sessionTimeout = 4 * time.Second
	testRoot       = "/shop/test/zklock"
)

func TestConformance(t *testing.T) {
	runConformance(t, serverAddrs(t))
}

// runConformance runs the suite on the ZooKeeper at addrs (one server or
// an ensemble).
func runConformance(t *testing.T, addrs []string) {
	locktest.Run(t, locktest.Harness{
		New: func(t testing.TB) lockkit.Locker { return open(t, addrs) },
		Wired: func(t testing.TB, w *locktest.Wire) lockkit.Locker {
			proxied := make([]string, len(addrs))
			for i, a := range addrs {
				proxied[i] = w.Proxy(a)
			}
			return open(t, proxied)
		},
		// An operator deletes the holder's node, through a session of its
		// own, possibly on another member than the holder's.
		Steal: func(t testing.TB, key string) {
			l := open(t, addrs)
			defer l.Close()
			nodes := queue(t, l, key)
			if len(nodes) == 0 {
				t.Fatalf("no node to steal for %q", key)
			}
			if err := l.conn.Delete(nodes[0], -1); err != nil {
				t.Fatal(err)
			}
		},
		TTL:        300 * time.Millisecond,
		CrashSlack: 2 * sessionTimeout,
	})
}

// A waiter whose context ends leaves no node behind, and the rest of the
// queue keeps its order.
func TestCancelledWaiterLeavesNoNode(t *testing.T) {
	addrs := serverAddrs(t)
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	a, b := open(t, addrs), open(t, addrs)
	la := try(t, a, key)
	defer la.Release(ctx)
	wctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(wctx, key); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v, want DeadlineExceeded", err)
	}
	if nodes := queue(t, a, key); len(nodes) != 1 {
		t.Fatalf("after the waiter gave up, the queue is %v; want only the holder", nodes)
	}
}

// Keys are escaped into one path element each: a key with '/' is not a
// child of another key, and the keys that are not valid path elements work.
func TestKeysAreEscaped(t *testing.T) {
	l := open(t, serverAddrs(t))
	ctx := context.Background()
	keys := []string{"a", "a/b", "", ".", "..", "%", "%2E", "lock:stock:ü", "a b/../c"}
	dirs := map[string]string{}
	for _, k := range keys {
		k = "zklock:test:" + t.Name() + k
		if d, ok := dirs[l.dir(k)]; ok {
			t.Fatalf("keys %q and %q share directory %s", k, d, l.dir(k))
		}
		dirs[l.dir(k)] = k
	}
	for _, k := range []string{"", ".", ".."} { // directly under the root
		lease, err := l.TryAcquire(ctx, k, lockkit.WithTTL(time.Minute))
		if err != nil {
			t.Fatalf("TryAcquire(%q): %v", k, err)
		}
		defer lease.Release(ctx)
	}
	for _, k := range keys {
		lease := try(t, l, "zklock:test:"+t.Name()+k)
		defer lease.Release(ctx)
	}
}

// A create that the server applied but whose reply was lost leaves no
// orphan: the retry finds the node by its GUID and uses it.
func TestLostCreateReplyIsFound(t *testing.T) {
	addrs := serverAddrs(t)
	tp := &tap{}
	a := open(t, addrs, withDialer(tp.dial))
	b := open(t, addrs)
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	if err := a.mkdirs(a.dir(key)); err != nil {
		t.Fatal(err)
	}
	tp.dropNextCreateReply()
	la := try(t, a, key)
	if !tp.dropped() {
		t.Fatal("no create reply was dropped")
	}
	if nodes := queue(t, b, key); len(nodes) != 1 {
		t.Fatalf("queue after a lost reply is %v, want one node", nodes)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := try(t, b, key)
	_ = lb.Release(ctx)
}

// The look for a node whose create reply was lost waits for the session
// to come back: asked while the client is still reconnecting, it is
// failed by the client (zk.ErrNoServer), not answered by the server.
func TestLostCreateReplyIsFoundAfterASlowReconnect(t *testing.T) {
	addrs := serverAddrs(t)
	tp := &tap{}
	a := open(t, addrs, withDialer(tp.dial))
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	if err := a.mkdirs(a.dir(key)); err != nil {
		t.Fatal(err)
	}
	tp.dropNextCreateReply()
	tp.refuseDials(1)
	lease, err := a.Acquire(ctx, key, lockkit.WithWaitTimeout(20*time.Second))
	if err != nil {
		t.Fatalf("acquire across a lost create reply and a slow reconnect: %v", err)
	}
	if !tp.dropped() {
		t.Fatal("no create reply was dropped")
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// After a lost create reply the client may reconnect to a member that has
// not applied the create yet. The look for the node syncs that member with
// the leader first: a listing without it misses the node, a second node is
// created behind it, and the first, ours and ahead, blocks the key until
// the session ends.
func TestLostCreateReplyIsFoundOnAMemberThatLags(t *testing.T) {
	addrs := serverAddrs(t)
	tp := &tap{}
	a := open(t, addrs, withDialer(tp.dial))
	b := open(t, addrs)
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	if err := a.mkdirs(a.dir(key)); err != nil {
		t.Fatal(err)
	}
	tp.dropNextCreateReplyAndLag()
	// The bound only ends a failing run: a grant needs no waiting here.
	lease, err := a.Acquire(ctx, key, lockkit.WithWaitTimeout(3*sessionTimeout))
	if !tp.dropped() {
		t.Fatal("no create reply was dropped")
	}
	if err != nil {
		t.Fatalf("acquire across a lost create reply and a lagging member: %v; queue %v", err, queue(t, b, key))
	}
	if nodes := queue(t, b, key); len(nodes) != 1 {
		t.Errorf("queue after a lost reply is %v, want one node", nodes)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lb := try(t, b, key)
	_ = lb.Release(ctx)
}

func BenchmarkUncontended(b *testing.B) {
	addrs := serverAddrs(b)
	ctx := context.Background()
	// A key of its own per run: history left under a key by earlier runs
	// (etcd keeps deleted names until compaction) must not be measured.
	key := "bench-" + rand.Text()
	b.Run("zklock", func(b *testing.B) {
		l := open(b, addrs)
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
	b.Run("go-zookeeper-lock", func(b *testing.B) {
		conn := dialZK(b, addrs)
		lock := zk.NewLock(conn, testRoot+"/peer/"+key, zk.WorldACL(zk.PermAll))
		for b.Loop() {
			if err := lock.Lock(); err != nil {
				b.Fatal(err)
			}
			if err := lock.Unlock(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("round-trip", func(b *testing.B) {
		conn := dialZK(b, addrs)
		for b.Loop() {
			if _, _, err := conn.Exists(testRoot); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func serverAddrs(t testing.TB) []string { return testenv.RequireList(t, "SHOP_TEST_ZK_ADDRS") }

func open(t testing.TB, addrs []string, opts ...Option) *Locker {
	t.Helper()
	l, err := New(addrs, sessionTimeout, append([]Option{WithRoot(testRoot)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

func dialZK(t testing.TB, addrs []string) *zk.Conn {
	conn, _, err := zk.Connect(addrs, sessionTimeout, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return conn
}

func withDialer(d zk.Dialer) Option { return func(c *config) { c.dialer = d } }

// queue lists key's nodes in queue order.
func queue(t testing.TB, l *Locker, key string) []string {
	t.Helper()
	children, _, err := l.conn.Children(l.dir(key))
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(children, func(a, b string) int {
		sa, _ := sequence(a)
		sb, _ := sequence(b)
		return cmp.Compare(sa, sb)
	})
	for i, c := range children {
		children[i] = l.dir(key) + "/" + c
	}
	return children
}

func try(t testing.TB, l lockkit.Locker, key string, opts ...lockkit.Option) lockkit.Lease {
	t.Helper()
	lease, err := l.TryAcquire(context.Background(), key, opts...)
	if err != nil {
		t.Fatalf("TryAcquire %s: %v", key, err)
	}
	return lease
}

func acquire(t testing.TB, l lockkit.Locker, key string, opts ...lockkit.Option) lockkit.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*sessionTimeout)
	defer cancel()
	lease, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Acquire %s: %v", key, err)
	}
	return lease
}

// acquireLater acquires key in a goroutine and hands the lease over.
func acquireLater(t *testing.T, l *Locker, key string) <-chan lockkit.Lease {
	t.Helper()
	ch := make(chan lockkit.Lease, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 3*sessionTimeout)
		defer cancel()
		lease, err := l.Acquire(ctx, key)
		if err != nil {
			t.Errorf("Acquire %s: %v", key, err)
			close(ch)
			return
		}
		ch <- lease
	}()
	return ch
}

// take waits for acquireLater's lease.
func take(t *testing.T, ch <-chan lockkit.Lease) lockkit.Lease {
	t.Helper()
	select {
	case lease, ok := <-ch:
		if !ok {
			t.FailNow()
		}
		return lease
	case <-time.After(4 * sessionTimeout):
		t.Fatal("no lease")
		return nil
	}
}

// settle waits until key's queue has n nodes and every waiting node of l
// has its watches set.
func settle(t *testing.T, l *Locker, key string, n int) {
	t.Helper()
	for deadline := time.Now().Add(sessionTimeout); ; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the queue never reached %d nodes with their watches set", n)
		}
		if len(queue(t, l, key)) < n {
			continue
		}
		l.mu.Lock()
		ready := true
		for _, e := range l.nodes {
			ready = ready && (e.granted || e.watched)
		}
		l.mu.Unlock()
		if ready {
			return
		}
	}
}

// assertHeld checks, from another Locker, that key is held.
func assertHeld(t *testing.T, addrs []string, key string) {
	t.Helper()
	if lease, err := open(t, addrs).TryAcquire(context.Background(), key); !errors.Is(err, lockkit.ErrNotAcquired) {
		if err == nil {
			_ = lease.Release(context.Background())
		}
		t.Fatalf("TryAcquire by another Locker = %v, want ErrNotAcquired", err)
	}
}

// go-zookeeper's goroutines can outlive Close: under a lost quorum its
// loop was seen blocked for good in flushRequests, sending to a response
// channel nobody reads. Close must return all the same, bounded by the
// session timeout, not wait for ever for the client's events to end.
func TestCloseReturnsWhenTheClientsGoroutinesNeverEnd(t *testing.T) {
	l := open(t, serverAddrs(t))
	l.events = make(chan zk.Event) // a client whose goroutines never end
	closed := make(chan struct{})
	go func() { _ = l.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(sessionTimeout + 10*time.Second):
		t.Fatal("Close still waits for a client whose goroutines never end")
	}
}
