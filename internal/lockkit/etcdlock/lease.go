package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// grant hands the lease no Gone channel, which would cost a goroutine per
// lease: watchSession ends it if the session is lost.
func (l *Locker) grant(t ticket) lockkit.Lease {
	key, me, rev, s, o := t.key, t.me, t.rev, t.s, t.o
	h := &held{session: s}
	sent := time.Now()
	l.mu.Lock()
	// Under mu: expire and extend must see both the timer and the lease.
	h.timer = time.AfterFunc(time.Until(sent.Add(o.TTL)), func() { l.expire(me, rev, h) })
	h.lease = backend.NewLease(backend.Grant{
		Key: key, Fence: uint64(rev), TTL: o.TTL, Watchdog: t.watchdog, Sent: sent,
		Extend:  func(ctx context.Context, ttl time.Duration) error { return l.extend(ctx, me, rev, h, ttl) },
		Release: func(ctx context.Context) error { return l.release(ctx, me, rev, h) },
		Closed:  l.closed,
	})
	l.held[h] = struct{}{}
	bornLost := s.lost // lost since the put; read under mu, as watchSession writes h.orphan
	h.orphan = bornLost
	l.mu.Unlock()
	if bornLost {
		_ = h.lease.Release(context.Background())
	}
	return h.lease
}

// extend checks the key is still ours and moves its deletion to ttl from
// now; the session lease keeps the key on the server meanwhile.
func (l *Locker) extend(ctx context.Context, me string, rev int64, h *held, ttl time.Duration) error {
	sent := time.Now()
	resp, err := l.client.Get(ctx, me) // linearizable: a stale read could miss a deletion
	if err != nil {
		return fmt.Errorf("%w: etcd: %w", lockkit.ErrUnavailable, err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != rev {
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

func (l *Locker) release(ctx context.Context, me string, rev int64, h *held) error {
	l.mu.Lock()
	if h.unsettled {
		l.mu.Unlock()
		return l.releaseAgain(ctx, me, rev)
	}
	delete(l.held, h)
	expired := !h.timer.Stop()
	orphan := h.orphan
	l.mu.Unlock()
	switch {
	case expired:
		return lockkit.ErrNotHeld
	case orphan:
		// The server may keep the key until the session's lease runs out
		// there; nobody trusts it now, so it may go at once.
		l.abandon(me, rev)
		return lockkit.ErrNotHeld
	}
	// A plain delete, as the Mutex's, is owner-checked too: the name holds
	// our session's lease id, and no other key of ours bears it while this
	// delete may still be applied. A compare would cost the server a read
	// of the key on the common path. A delete whose outcome is unknown may
	// be applied late (a proposal forwarded by another member), after its
	// key is gone: the name is retired then, never claimed again (a new
	// session brings new names), so that it cannot delete a later grant.
	deleted, err := l.handOff(ctx, me, rev)
	if err != nil {
		l.retire(me, h.session.id)
		l.bury(me, rev)
		l.mu.Lock()
		h.unsettled = true
		l.mu.Unlock()
		return fmt.Errorf("%w: etcd: %w", lockkit.ErrUnavailable, err)
	}
	l.unclaim(me)
	if !deleted {
		return lockkit.ErrNotHeld
	}
	return nil
}

// releaseAgain answers a release called again after one the store did not
// answer. The burial deletes the key in the background meanwhile, and the
// first delete may land late, so a key found gone was most likely freed by
// our own hand: that is not ErrNotHeld, which says another owner was found.
func (l *Locker) releaseAgain(ctx context.Context, me string, rev int64) error {
	if _, err := l.remove(ctx, me, rev); err != nil {
		return fmt.Errorf("%w: etcd: %w", lockkit.ErrUnavailable, err)
	}
	return nil
}

// expire gives the key back once its lease ran out. The key outlives the
// lease only if the session does, but then it would block the lock for as
// long as this process lives.
func (l *Locker) expire(me string, rev int64, h *held) {
	l.mu.Lock()
	delete(l.held, h)
	lost := h.lease.Lost()
	l.mu.Unlock()
	<-lost // closes at this same deadline: never free a key its holder still trusts
	l.abandon(me, rev)
}

// currentSession returns the live session, opening one if there is none.
func (l *Locker) currentSession(ctx context.Context) (*session, error) {
	if s := l.liveSession(); s != nil {
		return s, nil
	}
	select {
	case l.newSession <- struct{}{}:
		defer func() { <-l.newSession }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if s := l.liveSession(); s != nil {
		return s, nil // another caller opened it while we waited
	}
	sent := time.Now()
	resp, err := l.client.Grant(clientv3.WithRequireLeader(ctx), int64(l.sessionTTL.Seconds()))
	if err != nil {
		return nil, err
	}
	id := resp.ID
	// lockkit's watchdog renews the session every TTL/3 and closes Lost at
	// send time + TTL of the last renewal the server answered: never after
	// the server expires the lease. (concurrency.Session counts from the
	// reply's arrival and checks once a second: up to a second late.)
	s := &session{id: id, lease: backend.NewLease(backend.Grant{
		Key: "session", TTL: l.sessionTTL, Watchdog: true, Sent: sent,
		Extend: func(ctx context.Context, _ time.Duration) error {
			resp, err := l.client.KeepAliveOnce(ctx, id)
			if errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && resp.TTL <= 0 {
				return lockkit.ErrNotHeld
			}
			return err
		},
		Release: func(ctx context.Context) error {
			_, err := l.client.Revoke(ctx, id)
			return err
		},
		Closed: l.closed,
	})}
	l.mu.Lock()
	defer l.mu.Unlock()
	if backend.IsClosed(l.background.Done()) {
		_ = s.lease.Release(ctx)
		return nil, lockkit.ErrClosed
	}
	l.session = s
	for me, old := range l.retired {
		if old != id {
			delete(l.retired, me)
			delete(l.names, me)
		}
	}
	l.watchers.Go(func() { l.watchSession(s) })
	return s, nil
}

func (l *Locker) liveSession() *session {
	l.mu.Lock()
	s := l.session
	l.mu.Unlock()
	if s != nil && !backend.IsClosed(s.lease.Lost()) {
		return s
	}
	return nil
}

// watchSession ends the leases of s once s is lost: their keys cannot be
// trusted any more. Release closes each one's Lost at once and, as the
// lease is an orphan, lets its key go in the background.
func (l *Locker) watchSession(s *session) {
	<-s.lease.Lost()
	var orphans []*held
	l.mu.Lock()
	s.lost = true
	for h := range l.held {
		if h.session == s {
			h.orphan = true
			orphans = append(orphans, h)
		}
	}
	l.mu.Unlock()
	for _, h := range orphans {
		_ = h.lease.Release(context.Background())
	}
}
