package zklock

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// grant turns our first-in-line node into a lease. epoch is from before we
// saw the node first: if the connection dropped since, the lease is born
// lost, as it would have been lost had it been granted a moment earlier.
//
// Unless inherited (see inherit), the fence is the directory's pzxid as
// read with the children list that showed our node first: the zxid of the
// directory's last change of children. Our turn came only after the
// previous holder's node was deleted, a change of children above the
// previous holder's token, so every grant's token is above every earlier
// grant's. It costs no request
// beyond the list we read anyway (a node's czxid would cost a read after the
// grant); sequence numbers would not do: they restart if the directory is
// ever recreated.
func (l *Locker) grant(t ticket, e *entry, epoch, fence uint64) (lockkit.Lease, error) {
	key, node, o := t.key, t.node, t.o
	sent := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e.granted, e.fence = true, fence
	e.gone = make(chan struct{})
	if l.epoch != epoch || e.deleted {
		close(e.gone)
	}
	// Under mu: expire and extend must see both the timer and the lease.
	e.session = t.session
	e.timer = time.AfterFunc(time.Until(sent.Add(o.TTL)), func() { l.expire(node, e) })
	e.lease = backend.NewLease(backend.Grant{
		Key: key, Fence: fence, TTL: o.TTL, Watchdog: t.watchdog, Sent: sent,
		Extend:  func(_ context.Context, ttl time.Duration) error { return l.extend(node, e, ttl) },
		Release: func(ctx context.Context) error { return l.release(ctx, node, e) },
		Gone:    e.gone,
		Closed:  l.background.Done(),
	})
	if !e.watched || e.watchEpoch != epoch {
		go l.watchOwn(node, e)
	}
	return e.lease, nil
}

// watchOwn sets a watch on our granted node, whose deletion (an operator,
// an expired session) onEvent turns into Lost at once. It runs after the
// grant, off the holder's path; a node already gone by then is lost now.
// A node that waited has its watch already (watchQueued).
func (l *Locker) watchOwn(node string, e *entry) {
	exists, _, _, err := l.conn.ExistsW(node)
	if err == nil && !exists {
		l.mu.Lock()
		closeOnce(e.gone)
		l.mu.Unlock()
	}
}

// extend checks the node is still ours and moves its deletion to ttl from
// now. ZooKeeper itself keeps the node as long as the session lives.
func (l *Locker) extend(node string, h *entry, ttl time.Duration) error {
	sent := time.Now()
	ok, stat, err := l.conn.Exists(node)
	if err != nil {
		return l.fail(err)
	}
	if !ok || stat.EphemeralOwner != l.conn.SessionID() {
		return lockkit.ErrNotHeld
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !h.timer.Stop() {
		return lockkit.ErrNotHeld // ran out meanwhile: expire is deleting it
	}
	h.timer.Reset(time.Until(sent.Add(ttl)))
	return nil
}

// release deletes the node. Its name holds a GUID and a sequence number
// that no other client ever gets, so deleting it is owner-checked. The
// client takes no context, so the deletion runs in a goroutine and release
// returns when ctx ends; the deletion goes on, retried if it fails. A
// release called again waits for that same deletion's outcome.
func (l *Locker) release(ctx context.Context, node string, h *entry) error {
	l.mu.Lock()
	started := h.released != nil
	expired := !started && !h.timer.Stop()
	if !started && !expired {
		h.released = make(chan struct{})
	}
	done := h.released
	l.mu.Unlock()
	if expired {
		l.forget(node)
		return lockkit.ErrNotHeld
	}
	if !started && !l.background.Go(func() { l.settleRelease(node, h, l.conn.Delete(node, -1)) }) {
		l.settleRelease(node, h, zk.ErrClosing) // closing the session deletes the node
	}
	select {
	case <-done:
		l.mu.Lock()
		defer l.mu.Unlock()
		return h.releaseErr
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// settleRelease records the outcome of the release's Delete of node.
func (l *Locker) settleRelease(node string, h *entry, err error) {
	switch {
	case err == nil:
	case errors.Is(err, zk.ErrNoNode), l.conn.SessionID() != h.session:
		err = lockkit.ErrNotHeld // its session expired, and the node with it
	default:
		l.bury(node)
		err = l.fail(err)
	}
	l.forget(node)
	l.mu.Lock()
	defer l.mu.Unlock()
	h.releasedOK = err == nil
	h.releaseErr = err
	close(h.released)
}

// expire gives the node back once its lease ran out. The node outlives the
// lease only if the session does, but then it would block the key for as
// long as this process lives.
func (l *Locker) expire(node string, h *entry) {
	l.mu.Lock()
	lost := h.lease.Lost()
	l.mu.Unlock()
	<-lost // closes at this same deadline: never free a node its holder still trusts
	l.forget(node)
	l.abandon(node)
}

func (l *Locker) forget(node string) {
	l.mu.Lock()
	delete(l.nodes, node)
	l.mu.Unlock()
}

// abandon deletes a node we no longer want. ref is its path or, when a
// lost reply left us without one, the path up to the sequence number. A
// deletion that fails, or takes longer than abandonWait, goes on in the
// background: a live session must never keep an orphan, which would block
// the key for as long as we live, and a caller who gave up must not wait
// for a half-open connection's timeout.
func (l *Locker) abandon(ref string) {
	done := make(chan bool, 1)
	if !l.background.Go(func() { done <- l.remove(ref) }) {
		return // closing the session deletes the node
	}
	timeout := time.NewTimer(abandonWait)
	defer timeout.Stop()
	select {
	case removed := <-done:
		if !removed {
			l.bury(ref)
		}
	case <-timeout.C:
		l.background.Go(func() {
			if !<-done {
				l.bury(ref)
			}
		})
	}
}

func (l *Locker) remove(ref string) bool {
	node := ref
	if strings.HasSuffix(ref, "-lock-") {
		var err error
		if node, err = l.find(ref); err != nil || node == "" {
			return err == nil
		}
	}
	err := l.conn.Delete(node, -1)
	return err == nil || errors.Is(err, zk.ErrNoNode)
}

// bury retries remove until it succeeds or the Locker closes; an expired
// session ends it too, as the node is then gone (ErrNoNode).
func (l *Locker) bury(ref string) {
	l.background.Go(func() {
		for {
			select {
			case <-l.background.Done():
				return
			case <-time.After(retryDelay):
			}
			if l.remove(ref) {
				return
			}
		}
	})
}
