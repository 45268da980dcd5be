package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
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
