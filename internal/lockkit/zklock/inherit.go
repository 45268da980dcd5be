package zklock

import (
	"context"

	"github.com/go-zookeeper/zk"
)

// watchQueued sets, once per epoch, the watch on our waiting node that
// inherit relies on and that the lease's Lost needs after the grant. It
// returns errVanished if the node is gone.
func (l *Locker) watchQueued(node string, e *entry) error {
	l.mu.Lock()
	if e.watched && e.watchEpoch == l.epoch {
		l.mu.Unlock()
		return nil
	}
	// Armed before the request is sent, so that an event onEvent sees
	// meanwhile disarms it rather than being overwritten.
	e.watched, e.watchEpoch = !e.deleted, l.epoch
	l.mu.Unlock()
	exists, _, _, err := l.conn.ExistsW(node)
	switch {
	case err != nil:
		return err
	case !exists:
		return errVanished
	}
	return nil
}

// inherit grants, without listing the queue again, a node whose
// predecessor was this Locker's and had been granted: nothing could queue
// ahead of the predecessor since, so its deletion (ev) leaves our node
// first. Our node must still be there: its watch, unbroken since it was
// set, has seen no deletion, and notifications arrive in zxid order, so a
// deletion before the predecessor's would have been seen first. One
// deletion that order cannot show is one in the same transaction as the
// predecessor's (a session's end deletes all its nodes at one zxid, and
// so may an operator's multi): so the predecessor's deletion must be our
// release's own Delete, confirmed, which deleted that node alone. Its
// reply follows the notification on the same connection; any other
// deletion lists the queue again.
//
// The fence is the predecessor's plus one. A fence is always below the
// zxid that deletes its node: a pzxid read before that deletion, or, by
// induction, at most the predecessor's deletion zxid. So this one is
// still below every later listing's pzxid, and above the predecessor's.
// It saves the listing that follows a hand-off, the one request of it
// that queues behind the session's pending writes.
//
// It earns its place: with the waiter listing the queue again instead
// (the recipe's way), lockbench's Contended run made 0.87× the cycles/s
// (0.37-1.18 per round) on one server and 0.82× (0.41-1.05) on 3 members:
// medians of 15 interleaved A/B rounds (docs/backends-zk-etcd.md).
func (l *Locker) inherit(ctx context.Context, e, ahead *entry, ev zk.Event) (fence, epoch uint64, ok bool) {
	if ahead == nil || ev.Type != zk.EventNodeDeleted {
		return 0, 0, false
	}
	l.mu.Lock()
	released := ahead.released
	l.mu.Unlock()
	if released == nil {
		return 0, 0, false // not deleted by our release
	}
	select {
	case <-released:
	case <-ctx.Done():
		return 0, 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !ahead.releasedOK || !ahead.granted || !e.watched || e.deleted || e.watchEpoch != l.epoch {
		return 0, 0, false
	}
	return ahead.fence + 1, l.epoch, true
}
