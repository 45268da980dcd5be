package etcdlock

import (
	"context"
	"errors"
	"maps"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockbench/shop/internal/lockkit"
)

// countedLocker opens a Locker whose KV calls are counted.
func countedLocker(t testing.TB) (*Locker, *countingKV) {
	t.Helper()
	c := dial(t, serverEndpoints(t))
	kv := &countingKV{KV: c.KV}
	c.KV = kv
	l, err := FromClient(c, WithPrefix(testPrefix), WithSessionTTL(sessionTTL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l, kv
}

// acquireLater acquires key in a goroutine and hands the lease over.
func acquireLater(t *testing.T, l *Locker, key string) <-chan lockkit.Lease {
	t.Helper()
	ch := make(chan lockkit.Lease, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		lease, err := l.Acquire(ctx, key, lockkit.WithTTL(time.Minute))
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
	case <-time.After(10 * time.Second):
		t.Fatal("no lease")
		return nil
	}
}

// sum adds up calls.
func sum(calls map[string]int) (n int) {
	for _, c := range calls {
		n += c
	}
	return n
}

// A hand-off from a holder to the waiter just behind it in the same
// Locker costs one call, the release's: the waiter is granted on what
// that call found, without reading the queue again.
func TestHandOffWithinLockerIsOneCall(t *testing.T) {
	l, kv := countedLocker(t)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	c := dial(t, serverEndpoints(t))
	for round := range 5 {
		holder := try(t, l, key, lockkit.WithTTL(time.Minute))
		next := acquireLater(t, l, key)
		waitFor(t, func() bool { return queueLen(t, c, key) == 2 })
		time.Sleep(100 * time.Millisecond) // the waiter has read the queue and waits
		kv.reset()
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lease := take(t, next)
		calls := kv.snapshot()
		if n := sum(calls); n != 1 {
			t.Errorf("round %d: the hand-off made %v, want one call", round, calls)
		}
		if lease.Fence() <= holder.Fence() {
			t.Errorf("round %d: fence %d after the hand-off, not above the holder's %d", round, lease.Fence(), holder.Fence())
		}
		if n := queueLen(t, c, key); n != 1 {
			t.Errorf("round %d: %d keys queued after the hand-off, want the new holder's", round, n)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Across Lockers the waiter reads the queue once after the watch tells it
// its predecessor is gone: that read is what shows its own key is still
// there and nothing is left ahead of it.
func TestHandOffAcrossLockersReadsOnce(t *testing.T) {
	a, akv := countedLocker(t)
	b, bkv := countedLocker(t)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	c := dial(t, serverEndpoints(t))
	holder := try(t, a, key, lockkit.WithTTL(time.Minute))
	next := acquireLater(t, b, key)
	waitFor(t, func() bool { return queueLen(t, c, key) == 2 })
	time.Sleep(100 * time.Millisecond)
	akv.reset()
	bkv.reset()
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease := take(t, next)
	if got, want := akv.snapshot(), map[string]int{"Delete": 1}; !maps.Equal(got, want) {
		t.Errorf("the releasing Locker made %v, want %v", got, want)
	}
	if got, want := bkv.snapshot(), map[string]int{"Txn": 1}; !maps.Equal(got, want) {
		t.Errorf("the waiting Locker made %v, want %v", got, want)
	}
	_ = lease.Release(ctx)
}

// A waiter whose own key an operator deleted is not handed the lock by
// the release ahead of it: the release's compare finds the key gone, the
// waiter reads the queue, queues again, and the lease it gets is backed
// by a key that keeps everyone else out.
func TestWaiterWithoutItsKeyIsNotHandedTheLock(t *testing.T) {
	endpoints := serverEndpoints(t)
	l := open(t, endpoints)
	other := open(t, endpoints)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	c := dial(t, endpoints)
	holder := try(t, l, key, lockkit.WithTTL(time.Minute))
	next := acquireLater(t, l, key)
	waitFor(t, func() bool { return queueLen(t, c, key) == 2 })
	time.Sleep(100 * time.Millisecond) // the waiter has read the queue and waits
	resp, err := c.Get(ctx, dir(key), clientv3.WithLastCreate()...)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Delete(ctx, string(resp.Kvs[0].Key)); err != nil {
		t.Fatal(err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease := take(t, next)
	if n := queueLen(t, c, key); n != 1 {
		t.Errorf("%d keys queued while granted, want the holder's", n)
	}
	if _, err := other.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Errorf("another Locker's TryAcquire while the lease is held = %v, want ErrNotAcquired", err)
	}
	if lease.Fence() <= holder.Fence() {
		t.Errorf("fence %d, not above the holder's %d", lease.Fence(), holder.Fence())
	}
	_ = lease.Release(ctx)
}

// A release whose reply is slow does not keep the lock from the waiter
// behind it: once the deletion's event has come, the waiter waits a
// little for the reply, then reads the queue itself.
func TestSlowReleaseReplyDoesNotHoldUpTheWaiter(t *testing.T) {
	c := dial(t, serverEndpoints(t))
	kv := &slowTxnKV{KV: c.KV}
	c.KV = kv
	l, err := FromClient(c, WithPrefix(testPrefix), WithSessionTTL(sessionTTL))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	holder := try(t, l, key, lockkit.WithTTL(time.Minute))
	next := acquireLater(t, l, key)
	waitFor(t, func() bool { return queueLen(t, c, key) == 2 })
	time.Sleep(100 * time.Millisecond)
	kv.slowDeletes(3 * time.Second)
	released := make(chan error, 1)
	go func() { released <- holder.Release(ctx) }()
	lease := take(t, next)
	select {
	case <-released:
		t.Error("the waiter was granted only after the slow release returned")
	default:
	}
	if lease.Fence() <= holder.Fence() {
		t.Errorf("fence %d, not above the holder's %d", lease.Fence(), holder.Fence())
	}
	if err := <-released; err != nil {
		t.Fatal(err)
	}
	kv.slowDeletes(0)
	_ = lease.Release(ctx)
}

// slowTxnKV, once told, delays the replies of the transactions that
// delete: the deletion is applied at once, its reply comes late.
type slowTxnKV struct {
	clientv3.KV
	mu    sync.Mutex
	delay time.Duration
}

func (k *slowTxnKV) slowDeletes(d time.Duration) {
	k.mu.Lock()
	k.delay = d
	k.mu.Unlock()
}

func (k *slowTxnKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	resp, err := k.KV.Delete(ctx, key, opts...)
	k.sleep()
	return resp, err
}

func (k *slowTxnKV) Txn(ctx context.Context) clientv3.Txn {
	return &slowTxn{Txn: k.KV.Txn(ctx), k: k}
}

func (k *slowTxnKV) sleep() {
	k.mu.Lock()
	d := k.delay
	k.mu.Unlock()
	time.Sleep(d)
}

type slowTxn struct {
	clientv3.Txn
	k       *slowTxnKV
	deletes bool
}

func (t *slowTxn) If(cs ...clientv3.Cmp) clientv3.Txn { t.Txn = t.Txn.If(cs...); return t }

func (t *slowTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	for _, op := range ops {
		t.deletes = t.deletes || op.IsDelete()
	}
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *slowTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *slowTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if t.deletes {
		t.k.sleep()
	}
	return resp, err
}

// Queueing costs one call: the transaction that puts our key also reads
// the key just ahead of it, and the waiter watches that key at once.
func TestQueueingIsOneCall(t *testing.T) {
	endpoints := serverEndpoints(t)
	holderLocker := open(t, endpoints)
	l, kv := countedLocker(t)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	c := dial(t, endpoints)
	holder := try(t, holderLocker, key, lockkit.WithTTL(time.Minute))
	kv.reset()
	next := acquireLater(t, l, key)
	waitFor(t, func() bool { return queueLen(t, c, key) == 2 })
	time.Sleep(100 * time.Millisecond) // the waiter waits
	if got, want := kv.snapshot(), map[string]int{"Txn": 1}; !maps.Equal(got, want) {
		t.Errorf("queueing behind a holder made %v, want %v", got, want)
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

// A waiter's key is its name and its create revision: a key put again
// under the same name (here by hand; in the wild by a put of ours that
// landed late) is not the waiter's. Taking it for ours let the waiter in
// beside the Locker queued after its real key.
func TestWaiterDoesNotTakeALaterKeyOfItsNameForItsOwn(t *testing.T) {
	endpoints := serverEndpoints(t)
	a, b, l := open(t, endpoints), open(t, endpoints), open(t, endpoints)
	ctx := context.Background()
	key := "etcdlock:test:" + t.Name()
	c := dial(t, endpoints)
	holder := try(t, a, key, lockkit.WithTTL(time.Minute))
	waiter := acquireLater(t, l, key)
	waitFor(t, func() bool { return queueLen(t, c, key) == 2 })
	resp, err := c.Get(ctx, dir(key), clientv3.WithLastCreate()...)
	if err != nil {
		t.Fatal(err)
	}
	name := string(resp.Kvs[0].Key)
	other := acquireLater(t, b, key)
	waitFor(t, func() bool { return queueLen(t, c, key) == 3 })
	// The waiter's key goes, and comes back under its name behind b's.
	if _, err := c.Delete(ctx, name); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Put(ctx, name, "", clientv3.WithLease(l.session.id)); err != nil {
		t.Fatal(err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	first := take(t, other)
	select {
	case lease := <-waiter:
		t.Errorf("fence %d granted while b holds fence %d", lease.Fence(), first.Fence())
		_ = lease.Release(ctx)
	case <-time.After(300 * time.Millisecond):
	}
	_ = first.Release(ctx)
	if lease := take(t, waiter); lease.Fence() <= first.Fence() {
		t.Errorf("fence %d after %d", lease.Fence(), first.Fence())
	} else {
		_ = lease.Release(ctx)
	}
}
