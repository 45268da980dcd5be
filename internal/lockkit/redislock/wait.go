package redislock

import (
	"cmp"
	"context"
	"errors"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// Pace of a plain head (backend.Pace). Redis tells a waiter of a release
// by a message, so a head never polls; these bound how long it trusts a
// message, or news from here, to come.
const (
	// messageGrace is how long a head that yielded after a run (the
	// release freed the key for the waiters elsewhere and published) waits
	// for that message before it looks on its own, should the message not
	// come (a stalled subscription): it races the waiters elsewhere on the
	// message, not ahead of it, or it would win nearly every time.
	messageGrace = 20 * time.Millisecond
	// heldGrace is when a head that waited out a lease held here looks
	// after that lease ended with no word from here: it was lost, not
	// released (a release here always nudges or wakes the head, or hands
	// it the key). Long enough for a release under way to say so first on
	// a loaded machine: a look before would mark the key.
	heldGrace = 200 * time.Millisecond
	// unheardPoll is how often a waiter looks at a key whose SUBSCRIBE
	// has not gone out (waitRoom.heard), and how often the room sends a
	// failed one again: it hears no release message meanwhile, and the
	// holder's TTL may be long.
	unheardPoll = 200 * time.Millisecond
)

// outage is how many looks running that could not reach Redis end a
// head's wait, and so the wait of those behind it (backend.Line): one lost
// reply on a loaded network is weather, not the process's verdict.
const outage = 2

var pace = backend.Pace{Yield: messageGrace, AfterHeld: func() time.Duration { return heldGrace }}

// wait waits for a refused Acquire's key until it is granted, or its wait
// or the Locker ends. pttl is what the holder's lease had left when the
// first attempt was refused: the waiter looks again by then.
func (l *Locker) wait(ctx, bounded context.Context, a acquisition, pttl time.Duration) (lockkit.Lease, error) {
	waitCtx, cancel := context.WithCancel(bounded)
	defer cancel()
	defer context.AfterFunc(l.closing, cancel)()
	var lease lockkit.Lease
	var err error
	if a.o.Fair {
		lease, err = l.waitFair(waitCtx, a, pttl)
	} else {
		lease, err = l.waitInLine(ctx, waitCtx, a, pttl)
	}
	if err != nil {
		return nil, l.waitErr(ctx, waitCtx, err)
	}
	return lease, nil
}

// waitInLine takes a plain waiter's place in the Locker's line and waits
// for its turn and then for the key. A grant handed to it and not taken
// is freed as it leaves; an outage it found as head ends the wait of those
// behind it.
func (l *Locker) waitInLine(ctx, waitCtx context.Context, a acquisition, pttl time.Duration) (lockkit.Lease, error) {
	p := l.line.Join(string(a.ks), a.o.TTL)
	lease, err := l.inLine(waitCtx, a, p, pttl)
	var outage error
	if errors.Is(l.waitErr(ctx, waitCtx, err), lockkit.ErrUnavailable) {
		outage = err
	}
	if h, _ := l.line.Leave(p, lease, outage).(*handover); h != nil {
		l.free(a.ks, h.owner)
	}
	return lease, err
}

func (l *Locker) inLine(waitCtx context.Context, a acquisition, p *backend.Place, pttl time.Duration) (lockkit.Lease, error) {
	first := backend.IsClosed(p.Turn())
	// Subscribed after joining: the confirmation then finds the place.
	subscribed, err := l.room.enter(a.ks, nil)
	if err != nil {
		return nil, err
	}
	defer l.room.exit(a.ks, nil)
	select {
	case <-p.Turn():
	case <-waitCtx.Done():
		return nil, waitCtx.Err()
	}
	if err := p.Outage(); err != nil {
		return nil, err
	}
	// The confirmation of our SUBSCRIBE wakes a head that sent it;
	// otherwise a release may have come before it joined, or its turn is
	// news of its own. A turn that came with a grant here waits that
	// lease out: asking now would be refused, and would mark the key.
	look := !(first && subscribed) && !p.Held()
	return l.waitTurn(waitCtx, a, p, look, pttl)
}

// waitTurn is the head's loop: it asks Redis for the key whenever it
// should look (backend.Place.Sleep), until it is granted (by Redis or by
// a hand-over here), waitCtx ends, or outage looks running fail to reach
// Redis.
func (l *Locker) waitTurn(waitCtx context.Context, a acquisition, p *backend.Place, look bool, wait time.Duration) (lockkit.Lease, error) {
	down := 0 // looks running that could not reach Redis
	for {
		if lease := l.takeHandOver(a, p); lease != nil {
			return lease, nil
		}
		if look {
			lease, pttl, err := l.attempt(waitCtx, a, waiting)
			switch {
			case lease != nil:
				return lease, nil
			case err == nil:
				p.Refused()
				down, wait = 0, pttl
			case down+1 < outage && errors.Is(err, lockkit.ErrUnavailable) && !ended(waitCtx):
				down, wait = down+1, 0
				// The failed attempt's grant, if it landed, is being
				// freed under its owner in the background; a retry under
				// that owner would be taken for it (acquire.lua) and freed
				// under us.
				a.owner = l.newOwner()
			default:
				return nil, err
			}
		}
		look = true
		wait = l.untilNextLook(a.ks, wait)
		if err := p.Sleep(waitCtx, waitCtx, max(wait, time.Millisecond), pace); err != nil {
			return nil, err
		}
	}
}

// takeHandOver returns the lease of a grant a release here handed to p,
// if any. Once closing it is not taken: Leave returns it to be freed, and
// the caller gets ErrClosed, as Close promises.
func (l *Locker) takeHandOver(a acquisition, p *backend.Place) lockkit.Lease {
	if l.closing.Err() != nil {
		return nil
	}
	h, _ := l.line.Take(p).(*handover)
	if h == nil {
		return nil
	}
	return l.newLease(a, h.owner, h.fence, h.sent)
}

// waitFair waits as a fair waiter: it calls in whenever it is woken (a
// release message names it, or names nobody), or its wait has passed, and
// at least every third of the waiter timeout to keep its place in the
// key's Redis queue.
func (l *Locker) waitFair(waitCtx context.Context, a acquisition, wait time.Duration) (lockkit.Lease, error) {
	w := &waiter{owner: a.owner, wake: make(chan struct{}, 1)}
	subscribed, err := l.room.enter(a.ks, w)
	if err != nil {
		l.abandonLater(a.ks, a.owner) // leave the queue
		return nil, err
	}
	defer l.room.exit(a.ks, w)
	// Reset before every wait; since Go 1.23 neither Reset nor Stop can
	// leave a stale tick behind, so no draining is needed.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for look := !subscribed; ; look = true {
		if look {
			lease, pttl, err := l.attempt(waitCtx, a, waiting)
			if lease != nil || err != nil {
				return lease, err
			}
			wait = pttl
		}
		wait = l.untilNextLook(a.ks, wait)
		timer.Reset(max(min(wait, l.waiterTimeout/3), time.Millisecond))
		select {
		case <-w.wake:
		case <-timer.C:
		case <-waitCtx.Done():
			l.abandonLater(a.ks, a.owner)
			return nil, waitCtx.Err()
		}
	}
}

// untilNextLook is wait, or unheardPoll if shorter while nobody here
// hears ks's release messages.
func (l *Locker) untilNextLook(ks keyset, wait time.Duration) time.Duration {
	if l.room.heard(ks) {
		return wait
	}
	return min(wait, unheardPoll)
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
