package redislock

import (
	"cmp"
	"context"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// wait queues a refused Acquire in the wait room until it is granted, or
// its wait or the Locker ends. pttl is what the holder's lease had left
// when the first attempt was refused: the waiter looks again by then.
func (l *Locker) wait(ctx, bounded context.Context, a acquisition, pttl time.Duration) (lockkit.Lease, error) {
	waitCtx, cancel := context.WithCancel(bounded)
	defer cancel()
	defer context.AfterFunc(l.closing, cancel)()
	w, subscribed, err := l.room.join(waitCtx, a.ks.channel(), a.owner, a.o.Fair, a.o.TTL)
	if err != nil {
		if a.o.Fair {
			l.abandonLater(a.ks, a.owner) // leave the queue
		}
		return nil, l.waitErr(ctx, waitCtx, err)
	}
	// The confirmation of our SUBSCRIBE wakes us; otherwise a release may
	// have come before we joined.
	look := !subscribed
	if w.heldHere > 0 {
		// Our turn came because the waiter ahead was granted the key:
		// asking now would be refused. Its release by this process wakes
		// us, and a lease that ends otherwise has run out by then.
		look, pttl = false, w.heldHere
	}
	lease, err := l.waitTurn(waitCtx, a, w, look, pttl)
	granted := time.Duration(0) // the TTL of our grant, if we got one
	if lease != nil {
		granted = a.o.TTL
	}
	l.room.leave(w, granted)
	if err != nil {
		return nil, l.waitErr(ctx, waitCtx, err)
	}
	return lease, nil
}

// waitTurn asks Redis for the key whenever w is woken, or wait has passed
// since it last heard, until it is granted (by Redis or by a release here)
// or waitCtx ends. A fair waiter calls in at least every third of the
// waiter timeout to keep its place.
func (l *Locker) waitTurn(waitCtx context.Context, a acquisition, w *waiter, look bool, wait time.Duration) (lockkit.Lease, error) {
	// Reset before every wait; since Go 1.23 neither Reset nor Stop can
	// leave a stale tick behind, so no draining is needed.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if lease := l.takeHandOver(a, w); lease != nil {
			return lease, nil
		}
		if look {
			lease, pttl, err := l.attempt(waitCtx, a, waiting)
			if lease != nil || err != nil {
				return lease, err
			}
			wait = pttl
		}
		look = true
		if a.o.Fair {
			wait = min(wait, l.waiterTimeout/3)
		}
		timer.Reset(max(wait, time.Millisecond))
		select {
		case <-w.wake:
		case <-timer.C:
		case <-waitCtx.Done():
			if a.o.Fair {
				l.abandonLater(a.ks, a.owner)
			}
			return nil, waitCtx.Err()
		}
	}
}

// takeHandOver returns the lease of a grant a release here handed to w,
// if any. Once closing it is not taken: leave frees it, and the caller
// gets ErrClosed, as Close promises.
func (l *Locker) takeHandOver(a acquisition, w *waiter) lockkit.Lease {
	if l.closing.Err() != nil {
		return nil
	}
	h := l.room.take(w)
	if h == nil {
		return nil
	}
	return l.newLease(a, h.owner, h.fence, h.sent)
}

// waitErr is what Acquire answers when a call under waitCtx, which ctx
// bounds, failed with err: err itself (nil too) if waitCtx had not ended,
// and otherwise why it ended.
func (l *Locker) waitErr(ctx, waitCtx context.Context, err error) error {
	switch {
	case err == nil || !ended(waitCtx):
		return err
	case ended(ctx):
		return cmp.Or(ctx.Err(), context.DeadlineExceeded)
	case l.closing.Err() != nil:
		return lockkit.ErrClosed
	}
	return backend.WaitErr(ctx, waitCtx)
}

// ended reports whether ctx is done or past its deadline: a dial or read
// that timed out on ctx's deadline can return before ctx itself is marked
// done, and its error must still read as the wait's end, not an outage.
func ended(ctx context.Context) bool {
	deadline, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(deadline)
}
