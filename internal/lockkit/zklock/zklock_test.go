package zklock

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"slices"
	"sync"
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
	// clients reconnect, and go-zookeeper v1.0.4 has a data race on
	// reconnect with watches set (an open upstream bug) that fails -race runs.
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

// A waiter cancelled while its connection is half open returns promptly:
// it does not wait for the client to time the connection out before its
// node's deletion fails. The node is deleted later in the background, or
// with the session.
func TestCancelOnHalfOpenConnectionReturnsPromptly(t *testing.T) {
	addrs := serverAddrs(t)
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	a := open(t, addrs)
	tp := &tap{}
	b := open(t, addrs, withDialer(tp.dial))
	la := acquire(t, a, key) // a black-holed session of an earlier run may hold it a while
	defer la.Release(ctx)

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := b.Acquire(wctx, key)
		done <- err
	}()
	for deadline := time.Now().Add(sessionTimeout); len(queue(t, a, key)) < 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the waiter never queued")
		}
	}
	// The waiter lists the queue, then sets its watch: let both arrive.
	time.Sleep(200 * time.Millisecond)
	tp.blackhole()
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire = %v, want Canceled", err)
		}
		if waited := time.Since(start); waited > time.Second {
			t.Fatalf("cancelled Acquire returned after %v on a half-open connection; want well under the client's %v read timeout", waited, sessionTimeout*2/3)
		}
	case <-time.After(2 * sessionTimeout):
		t.Fatal("cancelled Acquire did not return")
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

// When the connection drops, every lease is lost at once (Curator's
// default: SUSPENDED is lost), even though the session may survive. The
// node the session still holds is then deleted by Release, so the key is
// not blocked for the rest of the session.
func TestSuspendedConnectionLosesLeases(t *testing.T) {
	addrs := serverAddrs(t)
	tp := &tap{}
	a := open(t, addrs, withDialer(tp.dial))
	b := open(t, addrs)
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	la := try(t, a, key)
	session := a.conn.SessionID()

	tp.sever()
	select {
	case <-la.Lost():
	case <-time.After(sessionTimeout):
		t.Fatal("Lost still open after the connection dropped")
	}
	// Suspended leases are lost, not released: the key is still held.
	if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("TryAcquire while the node lives = %v, want ErrNotAcquired", err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatalf("Release after reconnecting: %v", err)
	}
	if a.conn.SessionID() != session {
		t.Fatalf("the session changed (%x, was %x): the test meant a short drop", a.conn.SessionID(), session)
	}
	lb := try(t, b, key)
	_ = lb.Release(ctx)
}

// Expiring the session (by closing it from a second connection, the trick
// Curator's tests use) loses its leases and frees its keys; the Locker goes
// on with a new session.
func TestSessionExpiryClosesLost(t *testing.T) {
	addrs := serverAddrs(t)
	tp := &tap{}
	a := open(t, addrs, withDialer(tp.dial))
	b := open(t, addrs)
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	la := try(t, a, key, lockkit.WithTTL(time.Minute))

	tp.expire(t)
	select {
	case <-la.Lost():
	case <-time.After(sessionTimeout):
		t.Fatal("Lost still open after the session was closed")
	}
	lb := acquire(t, b, key) // the server deleted a's node with its session
	if lb.Fence() <= la.Fence() {
		t.Fatalf("fence after expiry %d, not above %d", lb.Fence(), la.Fence())
	}
	if err := la.Release(ctx); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("Release of an expired lease = %v, want ErrNotHeld", err)
	}
	_ = lb.Release(ctx)
	la2 := acquire(t, a, key) // a new session
	_ = la2.Release(ctx)
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

// A hand-off from a holder to a waiter of the same Locker costs the waiter
// no request: it was behind a granted node, so that node's deletion makes
// it first, and its fence is one above the holder's.
func TestHandOffWithinLockerListsNothing(t *testing.T) {
	addrs := serverAddrs(t)
	tp := &tap{}
	l := open(t, addrs, withDialer(tp.dial))
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	holder := acquire(t, l, key)
	next := acquireLater(t, l, key)
	settle(t, l, key, 2)

	before := tp.sent()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease := take(t, next)
	after := tp.sent()
	if n := after[opGetChildren2] - before[opGetChildren2]; n != 0 {
		t.Errorf("the hand-off listed the queue %d times, want 0", n)
	}
	if lease.Fence() <= holder.Fence() {
		t.Errorf("fence %d after the hand-off, not above the holder's %d", lease.Fence(), holder.Fence())
	}
	assertHeld(t, addrs, key)
	_ = lease.Release(ctx)
}

// A waiter whose predecessor gave up (it was never granted) is not first:
// it looks again, finds the holder, and waits for it.
func TestWaiterBehindCancelledWaiterWaitsForHolder(t *testing.T) {
	addrs := serverAddrs(t)
	l := open(t, addrs)
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	holder := acquire(t, l, key)
	pctx, cancel := context.WithCancel(ctx)
	cancelled := make(chan error, 1)
	go func() {
		_, err := l.Acquire(pctx, key)
		cancelled <- err
	}()
	settle(t, l, key, 2)
	next := acquireLater(t, l, key)
	settle(t, l, key, 3)

	cancel()
	if err := <-cancelled; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire = %v", err)
	}
	select {
	case <-next:
		t.Fatal("granted while the holder still holds the key")
	case <-time.After(300 * time.Millisecond):
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease := take(t, next)
	if lease.Fence() <= holder.Fence() {
		t.Errorf("fence %d, not above the holder's %d", lease.Fence(), holder.Fence())
	}
	_ = lease.Release(ctx)
}

// A waiter whose own node an operator deleted is not granted when its
// predecessor goes: it queues again, and the lease it gets is backed by a
// node that keeps everyone else out.
func TestWaiterWithoutItsNodeIsNotGranted(t *testing.T) {
	addrs := serverAddrs(t)
	l := open(t, addrs)
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	holder := acquire(t, l, key)
	next := acquireLater(t, l, key)
	settle(t, l, key, 2)

	if err := dialZK(t, addrs).Delete(queue(t, l, key)[1], -1); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond) // let the deletion's notification arrive first
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease := take(t, next)
	assertHeld(t, addrs, key)
	select {
	case <-lease.Lost():
		t.Fatal("the lease is lost")
	default:
	}
	_ = lease.Release(ctx)
}

// A waiter whose connection dropped while it waited does not take its
// predecessor's deletion on trust: it lists the queue again.
func TestWaiterAcrossDisconnectListsAgain(t *testing.T) {
	// The drop is meant short: a round whose session did not survive it
	// (a slow machine) shows nothing, and another one runs.
	for round := range 3 {
		if waiterAcrossDisconnect(t, fmt.Sprintf("zklock:test:%s-%d", t.Name(), round)) {
			return
		}
	}
	t.Fatal("the session changed across the drop in every round")
}

// waiterAcrossDisconnect runs one round on key; false if the session
// changed across the drop.
func waiterAcrossDisconnect(t *testing.T, key string) bool {
	addrs := serverAddrs(t)
	tp := &tap{}
	l := open(t, addrs, withDialer(tp.dial))
	ctx := context.Background()
	holder := acquire(t, l, key)
	next := acquireLater(t, l, key)
	settle(t, l, key, 2)
	session := l.conn.SessionID()

	tp.sever()
	select {
	case <-holder.Lost():
	case <-time.After(sessionTimeout):
		t.Fatal("Lost still open after the connection dropped")
	}
	if !sessionSurvived(t, l, session) {
		if lease, ok := <-next; ok { // the holder's node went with the session
			_ = lease.Release(ctx)
		}
		return false
	}
	before := tp.sent()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease := take(t, next)
	if n := tp.sent()[opGetChildren2] - before[opGetChildren2]; n == 0 {
		t.Error("granted across a disconnect without listing the queue")
	}
	if lease.Fence() <= holder.Fence() {
		t.Errorf("fence %d, not above the holder's %d", lease.Fence(), holder.Fence())
	}
	assertHeld(t, addrs, key)
	_ = lease.Release(ctx)
	return true
}

// A waiter whose request was cut off with the connection (its reply lost,
// the session alive) waits on: it lists the queue again once the client
// has reconnected. Before, the waiter's Acquire failed with ErrUnavailable
// ("zk: connection closed"), which made TestWaiterAcrossDisconnectListsAgain
// fail in CI when its drop caught the waiter's watch on its way.
func TestWaiterOutlivesARequestCutOffWithTheConnection(t *testing.T) {
	for _, tc := range []struct {
		name string
		op   int32
	}{
		{"listing", opGetChildren2},
		{"watch on the node ahead", opGetData},
		{"watch on its own node", opExists},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for round := range 3 {
				if waiterAcrossCutRequest(t, fmt.Sprintf("zklock:test:%s-%d", t.Name(), round), tc.op) {
					return
				}
			}
			t.Fatal("the session changed across the drop in every round")
		})
	}
}

// waiterAcrossCutRequest runs one round on key, cutting the connection
// after the waiter's first request with opcode op; false if the session
// changed across the drop.
func waiterAcrossCutRequest(t *testing.T, key string, op int32) bool {
	addrs := serverAddrs(t)
	tp := &tap{}
	l := open(t, addrs, withDialer(tp.dial))
	ctx := context.Background()
	holder := acquire(t, l, key)
	awaitHolderWatch(t, tp)
	session := l.conn.SessionID()
	tp.severAfterNext(op)
	next := acquireLater(t, l, key)
	select {
	case <-holder.Lost():
	case <-time.After(sessionTimeout):
		t.Fatal("the waiter's request never cut the connection")
	}
	if !sessionSurvived(t, l, session) {
		if lease, ok := <-next; ok {
			_ = lease.Release(ctx)
		}
		return false
	}
	settle(t, l, key, 2)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease := take(t, next)
	if lease.Fence() <= holder.Fence() {
		t.Errorf("fence %d, not above the holder's %d", lease.Fence(), holder.Fence())
	}
	assertHeld(t, addrs, key)
	_ = lease.Release(ctx)
	return true
}

// A waiter whose request was cut off with the connection, and that gets
// no session back, still returns when its wait times out: the client
// would hold the request asked again until it reconnects.
func TestWaiterCutOffForGoodReturnsAtItsWaitTimeout(t *testing.T) {
	addrs := serverAddrs(t)
	tp := &tap{}
	l := open(t, addrs, withDialer(tp.dial))
	key := "zklock:test:" + t.Name()
	holder := acquire(t, l, key)
	awaitHolderWatch(t, tp)
	tp.severForGood(opGetChildren2)
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(context.Background(), key, lockkit.WithWaitTimeout(time.Second))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, lockkit.ErrNotAcquired) {
			t.Errorf("Acquire = %v, want ErrNotAcquired", err)
		}
	case <-time.After(sessionTimeout):
		t.Fatal("Acquire still waiting, past its 1 s wait timeout, for a session that never comes")
	}
	<-holder.Lost()
}

// Fences rise along a queue that mixes hand-offs within a Locker
// (inherited fences) and across Lockers (listed ones).
func TestFencesRiseAcrossInheritedAndListedGrants(t *testing.T) {
	addrs := serverAddrs(t)
	a, b := open(t, addrs), open(t, addrs)
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	first := acquire(t, a, key)
	var waiters []<-chan lockkit.Lease
	for i, l := range []*Locker{a, b, b, a, a} {
		waiters = append(waiters, acquireLater(t, l, key))
		settle(t, l, key, i+2)
	}
	last := first
	for _, w := range waiters {
		if err := last.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lease := take(t, w)
		if lease.Fence() <= last.Fence() {
			t.Fatalf("fence %d after %d", lease.Fence(), last.Fence())
		}
		last = lease
	}
	_ = last.Release(ctx)
}

// sessionSurvived waits for l to reconnect and reports whether it kept
// session; a round whose session changed across its drop shows nothing.
func sessionSurvived(t *testing.T, l *Locker, session int64) bool {
	t.Helper()
	for deadline := time.Now().Add(sessionTimeout); l.conn.State() != zk.StateHasSession; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no reconnection")
		}
	}
	if l.conn.SessionID() != session {
		t.Logf("the session changed (%x, was %x) across the drop", l.conn.SessionID(), session)
		return false
	}
	return true
}

// awaitHolderWatch waits until a holder's own watch (an exists, sent after
// its grant) has gone out through tp.
func awaitHolderWatch(t *testing.T, tp *tap) {
	t.Helper()
	for deadline := time.Now().Add(sessionTimeout); tp.sent()[opExists] == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the holder's watch was never sent")
		}
	}
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

// tap sits between the client and the server: it can cut the connection,
// lose the reply to a create, and learn the session's password from the
// handshake, which the client library keeps to itself.
type tap struct {
	mu        sync.Mutex
	ops       map[int32]int // requests sent, by opcode
	conn      *tappedConn
	handshake []byte
	dropCount int
	dropArmed bool
	createXid []byte
	holed     bool
	severOp   int32 // opcode whose next request cuts the connection once sent; 0 for none
	refuse    bool  // dials fail: the server is gone
}

func (tp *tap) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	tp.mu.Lock()
	refuse := tp.refuse
	tp.mu.Unlock()
	if refuse {
		return nil, errors.New("tap: refused")
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	tc := &tappedConn{Conn: c, tap: tp}
	tp.mu.Lock()
	tp.conn, tp.handshake = tc, nil
	tp.mu.Unlock()
	return tc, nil
}

func (tp *tap) sever() {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	_ = tp.conn.Close()
}

// blackhole stops forwarding the client's requests, the connection left
// open: a half-open connection, which the client notices only when its
// read timeout (2/3 of the session timeout) passes without a reply.
func (tp *tap) blackhole() {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.holed = true
}

// severForGood cuts the connection after the next request with opcode op
// is sent, and refuses every dial after it.
func (tp *tap) severForGood(op int32) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.severOp, tp.refuse = op, true
}

// severAfterNext cuts the connection right after the next request with
// opcode op is sent: the server carries it out, its reply is lost.
func (tp *tap) severAfterNext(op int32) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.severOp = op
}

func (tp *tap) dropNextCreateReply() {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.dropArmed = true
}

// Opcodes of go-zookeeper's requests.
const (
	opExists       = 3  // Exists, ExistsW
	opGetData      = 4  // Get, GetW
	opGetChildren2 = 12 // Children
)

// sent counts the requests sent so far, by opcode.
func (tp *tap) sent() map[int32]int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return maps.Clone(tp.ops)
}

func (tp *tap) dropped() bool {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.dropCount > 0
}

type tappedConn struct {
	net.Conn
	tap *tap
}

func (c *tappedConn) Write(b []byte) (int, error) {
	tp := c.tap
	tp.mu.Lock()
	// A request is [length][xid][opcode]...; opcode 1 is create.
	if len(b) >= 12 {
		if tp.ops == nil {
			tp.ops = map[int32]int{}
		}
		tp.ops[int32(binary.BigEndian.Uint32(b[8:12]))]++
	}
	if tp.dropArmed && len(b) >= 12 && int32(binary.BigEndian.Uint32(b[8:12])) == 1 {
		tp.dropArmed, tp.createXid = false, bytes.Clone(b[4:8])
	}
	holed, sever := tp.holed, false
	if tp.severOp != 0 && len(b) >= 12 && int32(binary.BigEndian.Uint32(b[8:12])) == tp.severOp {
		tp.severOp, sever = 0, true
	}
	tp.mu.Unlock()
	if holed {
		return len(b), nil
	}
	n, err := c.Conn.Write(b)
	if sever {
		_ = c.Conn.Close()
	}
	return n, err
}

func (c *tappedConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	tp := c.tap
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if tp.conn == c && len(tp.handshake) < 64 {
		tp.handshake = append(tp.handshake, b[:n]...)
	}
	// The client reads a reply's length, then its body: [xid][zxid][err]...
	if tp.createXid != nil && n >= 16 && bytes.Equal(b[:4], tp.createXid) {
		tp.createXid = nil
		tp.dropCount++
		_ = c.Conn.Close()
		return 0, io.ErrUnexpectedEOF
	}
	return n, err
}

// expire closes the client's session from a second connection that
// presents the same session id and password.
func (tp *tap) expire(t *testing.T) {
	t.Helper()
	tp.mu.Lock()
	hs := bytes.Clone(tp.handshake)
	addr := tp.conn.RemoteAddr().String()
	tp.mu.Unlock()
	// [length][protocolVersion][timeout][sessionId][password length][password]
	if len(hs) < 24 {
		t.Fatalf("handshake not seen: %x", hs)
	}
	body := hs[4:]
	session := binary.BigEndian.Uint64(body[8:16])
	password := body[20 : 20+binary.BigEndian.Uint32(body[16:20])]

	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var req bytes.Buffer
	for _, v := range []any{int32(0), int64(0), int32(sessionTimeout.Milliseconds()), session, int32(len(password)), password, false} {
		_ = binary.Write(&req, binary.BigEndian, v)
	}
	send := func(body []byte) []byte {
		if err := binary.Write(c, binary.BigEndian, int32(len(body))); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(body); err != nil {
			t.Fatal(err)
		}
		var n int32
		if err := binary.Read(c, binary.BigEndian, &n); err != nil {
			t.Fatal(err)
		}
		reply := make([]byte, n)
		if _, err := io.ReadFull(c, reply); err != nil {
			t.Fatal(err)
		}
		return reply
	}
	if reply := send(req.Bytes()); binary.BigEndian.Uint64(reply[8:16]) != session {
		t.Fatalf("second connection did not join session %x: %x", session, reply)
	}
	closeSession := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 1), uint32(0xfffffff5)) // xid 1, opcode -11
	if reply := send(closeSession); len(reply) < 16 || binary.BigEndian.Uint32(reply[12:16]) != 0 {
		t.Fatalf("closeSession failed: %x", reply)
	}
}
