package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockbench/shop/internal/lockkit"
)

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
