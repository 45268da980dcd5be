package etcdlock

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockbench/shop/internal/lockkit"
)

// successor is a waiter queued just behind a key that may be ours.
type successor struct {
	key   string
	rev   int64
	after int64 // the create revision of the key it waits behind
	// releasing is set, under Locker.mu, when our release of that key
	// starts; the release then sends its verdict on handed, once: true
	// when its call deleted the key and found ours still queued.
	releasing bool
	handed    chan bool
}

// waitDelete returns when the key ahead of us, as read at revision rev,
// is deleted, or something else happened that calls for a fresh look.
// handed says our release of that key has handed the lock to us (next).
func (l *Locker) waitDelete(ctx context.Context, ahead *mvccpb.KeyValue, rev int64, next *successor, s *session) (handed bool, err error) {
	key := string(ahead.Key)
	next.after, next.handed = ahead.CreateRevision, make(chan bool, 1)
	l.mu.Lock()
	if other := l.next[key]; other == nil || other.rev < next.rev {
		// Two waiters behind one key: the earlier one's key is gone (the
		// later one read after it), and so is its claim to a hand-off.
		l.next[key] = next
	}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		if l.next[key] == next {
			delete(l.next, key)
		}
		l.mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := l.client.Watch(ctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	var verdictLate <-chan time.Time
	for {
		select {
		case handed := <-next.handed:
			return handed, nil
		case <-events: // a deletion, or the watch failed (compaction): look again
			// Unless our release deleted it: its reply, which often comes
			// just after this event, saves the look. A reply that is lost
			// or slow does not keep a free lock waiting.
			l.mu.Lock()
			releasing := next.releasing
			l.mu.Unlock()
			if releasing {
				events, verdictLate = nil, time.After(verdictWait)
				continue
			}
			return false, ctx.Err()
		case <-verdictLate:
			return false, ctx.Err()
		case <-s.lease.Lost():
			return false, errRequeue // our key cannot be trusted any more: requeue with a new session
		case <-ctx.Done():
			return false, ctx.Err()
		case <-l.closed:
			return false, lockkit.ErrClosed
		}
	}
}

// handOff deletes our granted key me and, when a waiter of ours is queued
// just behind it, tells that waiter in the same call whether it now holds
// the lock, so that it need not read the queue again.
//
// The waiter read the queue at some revision R after its put (revision
// r): no key with a create revision between rev and r was left then, and
// none can come, as create revisions only rise. No key older than ours
// was left when ours was granted. So once this call deletes our key, at
// revision D, no key older than the waiter's is left, and if the same
// call finds the waiter's key with revision r, that key is first in line
// at D: what the waiter's own read would have shown, one round trip
// later. Whatever else deleted a key (a lease run out, a session revoked,
// an operator), the compare or the count says so, and the waiter reads
// the queue again. Its fence is its create revision, as ever.
//
// It earns its place: with the waiter reading the queue again instead
// (concurrency.Mutex's way), lockbench's Contended run made 0.70× the
// cycles/s (0.47-0.90 per round) on one server and 0.85× (0.57-0.95) on 3
// members: medians of 15 interleaved A/B rounds (docs/backends-zk-etcd.md).
func (l *Locker) handOff(ctx context.Context, me string, rev int64) (deleted bool, err error) {
	l.mu.Lock()
	next := l.next[me]
	if next != nil && next.after == rev {
		next.releasing = true
	} else {
		next = nil
	}
	l.mu.Unlock()
	if next == nil {
		resp, err := l.client.Delete(ctx, me)
		if err != nil {
			return false, err
		}
		return resp.Deleted > 0, nil
	}
	handed := false
	defer func() { next.handed <- handed }() // buffered: the waiter may have left
	// The compare costs a read of one key, the waiter's, on this path
	// only; both branches delete.
	resp, err := l.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(next.key), "=", next.rev)).
		Then(clientv3.OpDelete(me)).Else(clientv3.OpDelete(me)).Commit()
	if err != nil {
		return false, err
	}
	deleted = resp.Responses[0].GetResponseDeleteRange().Deleted > 0
	handed = deleted && resp.Succeeded
	return deleted, nil
}
