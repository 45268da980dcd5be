package zklock

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockbench/shop/internal/lockkit"
)

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
