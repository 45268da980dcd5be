package redislock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// unheardPoll is how often a waiter looks while its Locker's SUBSCRIBE has
// not gone out (inbox.heard), and how often the inbox sends a failed one
// again: no message reaches the waiter meanwhile.
const unheardPoll = 200 * time.Millisecond

// outage is how many looks running that could not reach Redis end a wait:
// one lost reply on a loaded network is weather, not the verdict.
const outage = 2

// wait waits for a refused Acquire's key until it is granted, or its wait
// or the Locker ends. A waiter that gives up leaves the queue, and hands
// on a grant made to it meanwhile (release.lua).
func (l *Locker) wait(ctx, bounded context.Context, a acquisition) (lockkit.Lease, error) {
	waitCtx, cancel := context.WithCancel(bounded)
	defer cancel()
	defer context.AfterFunc(l.closing, cancel)()
	a.owner = l.newWaitingOwner(a.o.TTL)
	w, err := l.inbox.enter(a.ks, a.owner)
	if err != nil {
		return nil, err
	}
	lease, err := l.waitTurn(waitCtx, a, w)
	l.inbox.exit(w)
	if err != nil {
		l.releaseLater(a.ks, a.owner, true)
		return nil, l.waitErr(ctx, waitCtx, err)
	}
	return lease, nil
}

// waitTurn is the waiter's loop: it looks (wait.lua) on arrival, when told
// that the key is granted to it, when a release here hands it the key,
// when its subscription was (re)made and a message may have gone by, and
// when the holder's lease has run out (a crashed holder tells nobody);
// and at least every third of the waiter timeout, to keep its place.
// Told that it is next, it looks once the claim window of the waiter
// ahead has passed, unless its own turn comes first (inbox.isNext).
func (l *Locker) waitTurn(waitCtx context.Context, a acquisition, w *waiter) (lockkit.Lease, error) {
	// Reset before every wait; since Go 1.23 neither Reset nor Stop can
	// leave a stale tick behind, so no draining is needed.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	down := 0 // looks running that could not reach Redis
	for {
		lease, wait, err := l.look(waitCtx, a, w)
		switch {
		case lease != nil:
			return lease, nil
		case err == nil:
			down = 0
		case down+1 < outage && errors.Is(err, lockkit.ErrUnavailable) && !ended(waitCtx):
			// Looked again under the same owner: a grant the lost reply
			// carried is claimed, not refused.
			down, wait = down+1, 0
		default:
			return nil, err
		}
		wait = min(wait, l.waiterTimeout/3)
		if !l.inbox.heard() {
			wait = min(wait, unheardPoll)
		}
		timer.Reset(max(wait, time.Millisecond))
		select {
		case g := <-w.granted:
			if !g.told {
				return l.newLease(a, g.fence, g.sent, true), nil
			}
			trust := min(l.grantWindow(), a.o.TTL)
			if since, ok := l.inbox.trusted(w, g.fence, trust); ok {
				return l.claimLater(a, g.fence, since, trust), nil
			}
			// Spent, or too old to trust: the look claims it if it is ours.
			continue
		case <-w.news:
		case <-timer.C:
		case <-waitCtx.Done():
			return nil, waitCtx.Err()
		}
	}
}

// look runs wait.lua for a: a lease if the key is a's, or else how long
// to wait at most. A refusal tells w's inbox when it was sent and what it
// saw, which a grant told later must be above (inbox.trusted). A grant it
// made to another waiter here is handed on.
func (l *Locker) look(ctx context.Context, a acquisition, w *waiter) (lockkit.Lease, time.Duration, error) {
	sent := time.Now()
	res, err := waitScript.Run(ctx, l.client, a.ks.all(), a.owner, l.waiterTimeout.Milliseconds()).Slice()
	if err != nil {
		return nil, 0, unavailable(ctx, err)
	}
	if len(res) == 4 { // refused: {the ms to wait at most, the last token, TIME}
		r, err := parseRefusal(res, sent)
		if err != nil {
			return nil, 0, err
		}
		l.inbox.refused(w, r)
		return nil, r.wait, nil
	}
	owner, token, err := parseGrant(res)
	switch {
	case err != nil:
		return nil, 0, err
	case owner == a.owner:
		return l.newLease(a, token, sent, true), 0, nil
	}
	l.inbox.deliver(owner, grant{fence: token, sent: sent})
	return nil, a.o.TTL, nil
}

// parseRefusal reads wait.lua's refusal of a look sent at sent.
func parseRefusal(res []any, sent time.Time) (refusal, error) {
	wait, ok := res[0].(int64)
	last, errLast := parseToken(res[1])
	secs, errSecs := parseToken(res[2])
	micros, errMicros := parseToken(res[3])
	if !ok || errLast != nil || errSecs != nil || errMicros != nil {
		return refusal{}, fmt.Errorf("redislock: refusal %v", res)
	}
	return refusal{sent: sent, last: last, serverMicros: secs*1e6 + micros, wait: time.Duration(wait) * time.Millisecond}, nil
}

// claimLater is the lease of a grant with token fence that a release
// elsewhere made and told (inbox.trusted). Redis keeps the key the
// waiter's for the claim window from the grant, which followed since; its
// claim, an Extend to the lease's TTL sent at once, keeps it that TTL from
// when it lands. The lease trusts the shorter of the two (trust) from
// since until the claim comes back. A hand-off between processes so
// waits for the release's message alone; a claim that finds the key gone
// marks the lease lost.
func (l *Locker) claimLater(a acquisition, fence uint64, since time.Time, trust time.Duration) lockkit.Lease {
	first := a
	first.o.TTL = trust
	lease := l.newLease(first, fence, since, true)
	go func() {
		ctx, cancel := context.WithDeadline(context.Background(), since.Add(trust))
		defer cancel()
		_ = lease.Extend(ctx, a.o.TTL)
	}()
	return lease
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
