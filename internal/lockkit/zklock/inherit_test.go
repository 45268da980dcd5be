package zklock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockbench/shop/internal/lockkit"
)

// A session's end deletes all its ephemeral nodes in one transaction, so
// the holder's and its waiter's deletions share a zxid and their
// notifications come in no particular order. A waiter that hears of its
// predecessor's deletion first must not be granted on it: its own node is
// gone in the same transaction. It queues again with the new session.
func TestWaiterIsNotGrantedByItsSessionsEnd(t *testing.T) {
	addrs := serverAddrs(t)
	const rounds = 8
	for i := range rounds {
		tp := &tap{}
		l := open(t, addrs, withDialer(tp.dial))
		key := fmt.Sprintf("zklock:test:%s:%d", t.Name(), i)
		holder := acquire(t, l, key)
		next := make(chan lockkit.Lease, 1)
		go func() {
			wctx, cancel := context.WithTimeout(context.Background(), 3*sessionTimeout)
			defer cancel()
			// Refused while the client reconnects after the expiry: fine,
			// it was not granted.
			if lease, err := l.Acquire(wctx, key); err == nil {
				next <- lease
			}
			close(next)
		}()
		settle(t, l, key, 2)
		before := tp.sent()[opGetChildren2]

		tp.expire(t)
		<-holder.Lost()
		lease, ok := <-next
		if !ok {
			_ = l.Close()
			continue
		}
		listed := tp.sent()[opGetChildren2] - before
		select {
		case <-lease.Lost():
			t.Fatalf("round %d: the waiter was granted a lease already lost (its node went with the session; %d listings since)", i, listed)
		case <-time.After(200 * time.Millisecond):
		}
		_ = lease.Release(context.Background())
		_ = l.Close()
	}
}

// An operator (or any multi) deletes the holder's node and its waiter's in
// one transaction: one zxid, and the notifications follow in the multi's
// order, holder first. Until the waiter's own notification is read, its
// watch "saw no deletion", yet its node is gone: inherit must not grant
// it. The test holds the waiter's notification back a moment, as a slow
// read or a busy receive loop would.
func TestWaiterIsNotGrantedWhenDeletedWithItsPredecessor(t *testing.T) {
	addrs := serverAddrs(t)
	sd := &slowNotices{}
	l := open(t, addrs, withDialer(sd.dial))
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	holder := acquire(t, l, key)
	next := acquireLater(t, l, key)
	settle(t, l, key, 2)
	nodes := queue(t, l, key)
	sd.hold(path.Base(nodes[1]), 500*time.Millisecond)

	if _, err := dialZK(t, addrs).Multi(
		&zk.DeleteRequest{Path: nodes[0], Version: -1},
		&zk.DeleteRequest{Path: nodes[1], Version: -1},
	); err != nil {
		t.Fatal(err)
	}
	<-holder.Lost()
	lease := take(t, next)
	select {
	case <-lease.Lost():
		t.Fatalf("granted fence %d on a node deleted with its predecessor's (fence %d): Lost closed when its notification came", lease.Fence(), holder.Fence())
	case <-time.After(time.Second):
	}
	assertHeld(t, addrs, key)
	_ = lease.Release(ctx)
}

// slowNotices delays the client's reading of a watch notification whose
// body names a given node.
type slowNotices struct {
	mu    sync.Mutex
	name  string
	delay time.Duration
}

func (s *slowNotices) hold(name string, delay time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.name, s.delay = name, delay
}

func (s *slowNotices) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	return &slowConn{Conn: c, s: s}, nil
}

type slowConn struct {
	net.Conn
	s *slowNotices
}

// Read: the client reads each frame's length, then its body; a
// notification's body starts with xid -1.
func (c *slowConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.s.mu.Lock()
	name, delay := c.s.name, c.s.delay
	c.s.mu.Unlock()
	if name != "" && n >= 4 && bytes.Equal(b[:4], []byte{0xff, 0xff, 0xff, 0xff}) && bytes.Contains(b[:n], []byte(name)) {
		time.Sleep(delay)
	}
	return n, err
}

// The same one-transaction deletion repeats a fence. The holder was
// granted by a listing whose pzxid x was its predecessor's deletion; the
// multi deleting it and its waiter is the next transaction, x+1. The
// waiter inherits x+1; another Locker queued behind them lists next and
// reads pzxid x+1 too. Two leases, one fence.
func TestInheritedFenceIsNotRepeatedByTheNextListing(t *testing.T) {
	addrs := serverAddrs(t)
	sd := &slowNotices{}
	a := open(t, addrs, withDialer(sd.dial))
	b := open(t, addrs)
	op := dialZK(t, addrs)
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	_ = try(t, a, key).Release(ctx) // creates the directory
	dir := a.dir(key)
	first, err := op.Create(dir+"/"+protected+"operator-lock-", nil, zk.FlagEphemeral|zk.FlagSequence, zk.WorldACL(zk.PermAll))
	if err != nil {
		t.Fatal(err)
	}
	holderCh := acquireLater(t, a, key)
	settle(t, a, key, 2)
	next := acquireLater(t, a, key)
	settle(t, a, key, 3)
	other := acquireLater(t, b, key)
	for len(queue(t, a, key)) < 4 {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond) // b's watch set
	nodes := queue(t, a, key)
	sd.hold(path.Base(nodes[2]), 500*time.Millisecond)

	if err := op.Delete(first, -1); err != nil {
		t.Fatal(err)
	}
	holder := take(t, holderCh)
	if _, err := op.Multi(
		&zk.DeleteRequest{Path: nodes[1], Version: -1},
		&zk.DeleteRequest{Path: nodes[2], Version: -1},
	); err != nil {
		t.Fatal(err)
	}
	_, stat, err := op.Exists(dir)
	if err != nil {
		t.Fatal(err)
	}
	if uint64(stat.Pzxid) != holder.Fence()+1 {
		// Another write came between, so the old code would not have
		// repeated this fence; what follows must hold all the same.
		t.Logf("holder's fence %d, multi at %d: not consecutive zxids", holder.Fence(), stat.Pzxid)
	}
	listed := take(t, other)
	select {
	case inherited := <-next: // granted on the notification, node gone
		if inherited.Fence() == listed.Fence() {
			t.Errorf("fence %d given twice: inherited on a deleted node, and listed by another Locker", listed.Fence())
		}
		_ = inherited.Release(ctx)
		_ = listed.Release(ctx)
	case <-time.After(time.Second): // requeued behind the other Locker
		_ = listed.Release(ctx)
		if requeued := take(t, next); requeued.Fence() <= listed.Fence() {
			t.Errorf("fence %d after %d", requeued.Fence(), listed.Fence())
		} else {
			_ = requeued.Release(ctx)
		}
	}
}

// After Close, nothing of the Locker runs on: waiters queued behind a
// holder of the same Locker, inherited grants and their leases included.
func TestCloseLeavesNoGoroutineWithInheritedGrants(t *testing.T) {
	addrs := serverAddrs(t)
	ctx := context.Background()
	key := "zklock:test:" + t.Name()
	count := func(limit int) int {
		n := runtime.NumGoroutine()
		for deadline := time.Now().Add(5 * time.Second); n > limit && time.Now().Before(deadline); n = runtime.NumGoroutine() {
			time.Sleep(20 * time.Millisecond)
		}
		return n
	}
	time.Sleep(100 * time.Millisecond)
	before := runtime.NumGoroutine()
	l, err := New(addrs, sessionTimeout, WithRoot(testRoot))
	if err != nil {
		t.Fatal(err)
	}
	held := acquire(t, l, key)
	var waiters []<-chan lockkit.Lease
	for i := range 3 {
		ch := make(chan lockkit.Lease, 1)
		go func() {
			if lease, err := l.Acquire(ctx, key); err == nil {
				ch <- lease
			}
			close(ch) // ErrClosed for the last one
		}()
		waiters = append(waiters, ch)
		settle(t, l, key, i+2)
	}
	// Two hand-offs by inheritance; the third waiter is left queued.
	for _, w := range waiters[:2] {
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		held = take(t, w)
	}
	errs := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 3*sessionTimeout)
		defer cancel()
		_, err := l.Acquire(wctx, key+":other")
		errs <- err
	}()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	<-errs
	select {
	case <-held.Lost():
	case <-time.After(time.Second):
		t.Error("Lost of a held lease still open a second after Close")
	}
	select {
	case lease, ok := <-waiters[2]:
		if ok {
			t.Errorf("a waiter was granted fence %d during Close", lease.Fence())
		}
	case <-time.After(time.Second):
		t.Error("a waiter still waits a second after Close")
	}
	if n := count(before); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after Close, %d before New:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// An inherited grant relies on the watch its node got while waiting: an
// operator's delete of that node must still close Lost, also when the
// waiting watch was spent meanwhile by a change of the node's data.
func TestInheritedGrantLosesItsNode(t *testing.T) {
	for _, touch := range []bool{false, true} {
		t.Run(fmt.Sprintf("dataChanged=%v", touch), func(t *testing.T) {
			addrs := serverAddrs(t)
			l := open(t, addrs)
			op := dialZK(t, addrs)
			ctx := context.Background()
			key := "zklock:test:" + t.Name()
			holder := acquire(t, l, key)
			next := acquireLater(t, l, key)
			settle(t, l, key, 2)
			nodes := queue(t, l, key)
			if touch {
				if _, err := op.Set(nodes[1], []byte("x"), -1); err != nil {
					t.Fatal(err)
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			lease := take(t, next)
			if err := op.Delete(nodes[1], -1); err != nil {
				t.Fatal(err)
			}
			select {
			case <-lease.Lost():
			case <-time.After(2 * time.Second):
				t.Fatal("Lost still open 2 s after the holder's node was deleted")
			}
		})
	}
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
