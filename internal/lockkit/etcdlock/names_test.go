package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockbench/shop/internal/lockkit"
)

// A release whose reply is lost may still be applied later: behind a
// partition, a proposal forwarded by one member can reach the leader after
// requests sent through another. Meanwhile the name has been buried,
// unclaimed and reused by the next grant of the same session; the late
// deletion must not take that grant's key, or a second holder gets in.
func TestLateReleaseSparesTheNextGrantOfItsName(t *testing.T) {
	endpoints := serverEndpoints(t)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	c := dial(t, endpoints)
	kv := &lateKV{KV: c.KV}
	c.KV = kv
	a, err := FromClient(c, WithPrefix(testPrefix), WithSessionTTL(sessionTTL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Close() })
	b := open(t, endpoints)

	first := try(t, a, key, lockkit.WithTTL(time.Minute))
	apply := kv.delayNextWrite()
	if err := first.Release(ctx); err == nil {
		t.Fatal("Release with its reply lost returned nil")
	}
	// The buried deletion retries with a compare; on main it then frees
	// the name for the next grant (a fix may keep it claimed instead).
	waitFor(t, func() bool { return queueLen(t, c, key) == 0 })
	for deadline := time.Now().Add(time.Second); a.claimed(dir(key)) && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	second := try(t, a, key, lockkit.WithTTL(time.Minute))
	applied := apply() // the first release's request reaches the leader now
	<-applied

	other, err := b.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
	if err == nil {
		lost := false
		select {
		case <-second.Lost():
			lost = true
		default:
		}
		_ = other.Release(ctx)
		if !lost {
			t.Fatalf("two holders: another Locker got fence %d while fence %d still held (the late release deleted the reused name)",
				other.Fence(), second.Fence())
		}
	} else if !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatal(err)
	}
	_ = second.Release(ctx)
}

// claimed reports whether any name in dir is still claimed.
func (l *Locker) claimed(dir string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for n := range l.names {
		if len(n) > len(dir) && n[:len(dir)] == dir {
			return true
		}
	}
	return false
}

// lateKV, once armed, fails the next write (a Delete or a Txn) at once, as
// a lost reply would, and applies it only when the test says so.
type lateKV struct {
	clientv3.KV
	mu      sync.Mutex
	armed   bool
	release chan struct{}
	done    chan struct{}
}

func (k *lateKV) delayNextWrite() (apply func() <-chan struct{}) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.armed, k.release, k.done = true, make(chan struct{}), make(chan struct{})
	goCh, done := k.release, k.done
	return func() <-chan struct{} { close(goCh); return done }
}

func (k *lateKV) take() (goCh, done chan struct{}, ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.armed {
		return nil, nil, false
	}
	k.armed = false
	return k.release, k.done, true
}

func (k *lateKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	goCh, done, ok := k.take()
	if !ok {
		return k.KV.Delete(ctx, key, opts...)
	}
	go func() {
		<-goCh
		_, _ = k.KV.Delete(context.Background(), key, opts...)
		close(done)
	}()
	return nil, context.DeadlineExceeded
}

func (k *lateKV) Txn(ctx context.Context) clientv3.Txn {
	return &lateTxn{k: k, ctx: ctx}
}

type lateTxn struct {
	k                *lateKV
	ctx              context.Context
	cmps             []clientv3.Cmp
	thenOps, elseOps []clientv3.Op
}

func (t *lateTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.cmps = append(t.cmps, cs...); return t }
func (t *lateTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.thenOps = append(t.thenOps, ops...)
	return t
}
func (t *lateTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.elseOps = append(t.elseOps, ops...)
	return t
}

func (t *lateTxn) commit(ctx context.Context) (*clientv3.TxnResponse, error) {
	return t.k.KV.Txn(ctx).If(t.cmps...).Then(t.thenOps...).Else(t.elseOps...).Commit()
}

func (t *lateTxn) Commit() (*clientv3.TxnResponse, error) {
	writes := false
	for _, op := range append(append([]clientv3.Op{}, t.thenOps...), t.elseOps...) {
		writes = writes || op.IsDelete() || op.IsPut()
	}
	if writes {
		if goCh, done, ok := t.k.take(); ok {
			go func() {
				<-goCh
				_, _ = t.commit(context.Background())
				close(done)
			}()
			return nil, context.DeadlineExceeded
		}
	}
	return t.commit(t.ctx)
}

// After Close, nothing of the Locker runs on: not the session watchers of
// sessions lost on the way, nor the deletions their losses started.
func TestCloseLeavesNoGoroutineAfterSessionLosses(t *testing.T) {
	endpoints := serverEndpoints(t)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	c := dial(t, endpoints)
	settleGoroutines := func(limit int) int {
		n := runtime.NumGoroutine()
		for deadline := time.Now().Add(5 * time.Second); n > limit && time.Now().Before(deadline); n = runtime.NumGoroutine() {
			time.Sleep(20 * time.Millisecond)
		}
		return n
	}
	queueLen(t, c, key) // the operator's connection is up before counting
	time.Sleep(100 * time.Millisecond)
	before := runtime.NumGoroutine()
	l, err := New(endpoints, WithPrefix(testPrefix), WithSessionTTL(sessionTTL))
	if err != nil {
		t.Fatal(err)
	}
	var leases []lockkit.Lease
	for round := range 3 {
		leases = append(leases, try(t, l, fmt.Sprintf("%s:%d", key, round), lockkit.WithTTL(time.Minute)))
		waiting := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			defer cancel()
			_, err := l.Acquire(wctx, fmt.Sprintf("%s:%d", key, round))
			waiting <- err
		}()
		waitFor(t, func() bool { return queueLen(t, c, fmt.Sprintf("%s:%d", key, round)) == 2 })
		l.mu.Lock()
		id := l.session.id
		l.mu.Unlock()
		if _, err := c.Revoke(ctx, id); err != nil {
			t.Fatal(err)
		}
		select {
		case <-leases[round].Lost():
		case <-time.After(2 * sessionTTL):
			t.Fatalf("round %d: Lost open after the session was revoked", round)
		}
		<-waiting // granted on a new session (or timed out): either way it returned
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if n := settleGoroutines(before); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines after Close, %d before New:\n%s", n, before, buf[:runtime.Stack(buf, true)])
	}
}

// A stale key of ours under a name we do not claim next (a put applied
// after we gave it up, say) sits ahead of us with our own session's
// lease: nobody else will ever delete it while the session lives. An
// acquisition must not wait behind it for ever.
func TestStaleKeyOfOursUnderAnotherNameIsNotWaitedFor(t *testing.T) {
	endpoints := serverEndpoints(t)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	l := open(t, endpoints)
	c := dial(t, endpoints)
	stale := fmt.Sprintf("%s%016x-7", dir(key), l.session.id)
	if _, err := c.Put(ctx, stale, "", clientv3.WithLease(l.session.id)); err != nil {
		t.Fatal(err)
	}
	waitCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	lease, err := l.Acquire(waitCtx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire behind a stale key of our own session: %v", err)
	}
	_ = lease.Release(ctx)
}

// A queueing put whose reply is lost may land after sweep has stopped
// looking for it (callTimeout). Its name stays retired, so strayOfOurs
// no longer takes the key for a stray: it sits first in line with our live
// session's lease, and even this Locker's own Acquire waits behind it
// until its context ends. (Before names were retired, the name was freed and
// strayOfOurs deleted such a key.)
func TestLatePutOfASweptNameDoesNotBlockTheLock(t *testing.T) {
	endpoints := serverEndpoints(t)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	c := dial(t, endpoints)
	kv := &lateKV{KV: c.KV}
	c.KV = kv
	l, err := FromClient(c, WithPrefix(testPrefix), WithSessionTTL(sessionTTL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })

	apply := kv.delayNextWrite()
	if _, err := l.Acquire(ctx, key, lockkit.WithTTL(time.Minute)); !errors.Is(err, lockkit.ErrUnavailable) {
		t.Fatalf("Acquire with its put's reply lost = %v, want ErrUnavailable", err)
	}
	// sweep looks for the key for callTimeout, its last wait at most one
	// callTimeout more; the put lands only after that.
	time.Sleep(2*callTimeout + time.Second)
	<-apply()
	if n := queueLen(t, c, key); n != 1 {
		t.Fatalf("%d keys after the late put, want its one", n)
	}

	waitCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	lease, err := l.Acquire(waitCtx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire behind the late put of a swept name of our own session: %v (stuck behind a key nobody deletes)", err)
	}
	_ = lease.Release(ctx)
}

// An Acquire whose context ends during its put (a deadline under load)
// retires the put's name for the session's life, and sweep spends about
// callTimeout of calls on it even when the put was never sent. Names pile
// up in l.names with every such Acquire, and claim walks all of them.
func TestCancelledPutsDoNotRetireNamesForEver(t *testing.T) {
	endpoints := serverEndpoints(t)
	l := open(t, endpoints)
	key := "etcdlock:test:" + t.Name()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	const attempts = 50
	for range attempts {
		if _, err := l.Acquire(cancelled, key, lockkit.WithTTL(time.Minute)); !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire under a cancelled context = %v, want context.Canceled", err)
		}
	}
	deadline := time.Now().Add(2*callTimeout + time.Second)
	for l.claimed(dir(key)) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	l.mu.Lock()
	n := 0
	for name := range l.names {
		if len(name) > len(dir(key)) && name[:len(dir(key))] == dir(key) {
			n++
		}
	}
	l.mu.Unlock()
	if n > 0 {
		t.Fatalf("%d of %d names of puts that never reached the server are still claimed after %v", n, attempts, 2*callTimeout+time.Second)
	}
}

// A stray key of ours whose removal fails once (a request lost on the
// way) has its name retired by queue before the removal: from then on
// strayOfOurs takes it for a claimed name, and every later Acquire of this
// Locker waits behind it until its context ends, for as long as the
// session lives. (An earlier draft of the retirement never tried the removal again.)
func TestStrayWhoseRemovalFailedIsStillRemovedLater(t *testing.T) {
	endpoints := serverEndpoints(t)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	c := dial(t, endpoints)
	kv := &dropDeleteKV{KV: c.KV}
	c.KV = kv
	l, err := FromClient(c, WithPrefix(testPrefix), WithSessionTTL(sessionTTL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	operator := dial(t, endpoints)
	stale := fmt.Sprintf("%s%016x-7", dir(key), l.session.id)
	if _, err := operator.Put(ctx, stale, "", clientv3.WithLease(l.session.id)); err != nil {
		t.Fatal(err)
	}

	kv.drop.Store(stale)
	waitCtx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if _, err := l.Acquire(waitCtx, key, lockkit.WithTTL(time.Minute)); !errors.Is(err, lockkit.ErrUnavailable) {
		t.Fatalf("Acquire whose removal of the stray was lost = %v, want ErrUnavailable", err)
	}
	kv.drop.Store("")

	waitCtx, cancel = context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	lease, err := l.Acquire(waitCtx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("Acquire behind the stray once its first removal was lost: %v (the retired name is no stray any more)", err)
	}
	_ = lease.Release(ctx)
}

// dropDeleteKV fails, unapplied, each transaction that deletes the key
// named in drop, as a request lost on its way to the server would.
type dropDeleteKV struct {
	clientv3.KV
	drop atomic.Value // string
}

func (k *dropDeleteKV) Txn(ctx context.Context) clientv3.Txn {
	return &dropDeleteTxn{Txn: k.KV.Txn(ctx), k: k}
}

type dropDeleteTxn struct {
	clientv3.Txn
	k       *dropDeleteKV
	dropped bool
}

func (t *dropDeleteTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }
func (t *dropDeleteTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	target, _ := t.k.drop.Load().(string)
	for _, op := range ops {
		t.dropped = t.dropped || target != "" && op.IsDelete() && string(op.KeyBytes()) == target
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}
func (t *dropDeleteTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }
func (t *dropDeleteTxn) Commit() (*clientv3.TxnResponse, error) {
	if t.dropped {
		return nil, context.DeadlineExceeded
	}
	return t.Txn.Commit()
}
