package backend

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// tryGrace is how long a try started within the wait may run past the
// wait's deadline. Cut at the deadline, a try wastes the grant it may have
// won (it must be given back) and, on a SQL store, the connection the
// driver drops with a cancelled statement. Past capacity a line's head is
// the waiter with the least time left, so every head would be cut, and
// the key granted all the time and used by nobody
// (linetest.FloodedLineStillGrants).
const tryGrace = 50 * time.Millisecond

// Poller waits for a key by trying again after a jittered delay. It is for
// stores that cannot tell a waiter when a key is freed (Redlock, memcached,
// a lease row): the jitter keeps pollers from asking in step. Stores that
// can wake a waiter should.
//
// With a Line, only the head of the Locker's line for Key polls, a release
// through the same Locker makes it try at once, and the others wait their
// turn without asking the store: see Line.
type Poller struct {
	// MinDelay and MaxDelay bound the pause between two tries. With
	// Backoff the pause starts at MinDelay and doubles up to MaxDelay,
	// each one jittered in the upper half of its interval; without, each
	// is uniform in [MinDelay, MaxDelay].
	MinDelay, MaxDelay time.Duration
	Backoff            bool
	// Outage is how many attempts running that could not reach the store
	// (ErrUnavailable) end the wait with that error: one timeout on a
	// loaded network is weather, several running are an outage.
	Outage int
	// Closed ends the wait with ErrClosed.
	Closed <-chan struct{}
	// Line, if not nil, is the Locker's line, and Key the key waited for.
	Line *Line
	Key  string
}

// Acquire calls try until it grants, fails with something other than
// ErrNotAcquired, or the wait (ctx and o's wait timeout) ends. Each try
// gets ctx bounded by the wait's deadline plus tryGrace. An attempt that
// fails because the wait ended reports how the wait ended, not the
// attempt's own error. In a Line, the outage that
// ends the head's wait ends the wait of everyone then behind it.
func (p Poller) Acquire(ctx context.Context, o lockkit.Options, try func(tryCtx context.Context) (lockkit.Lease, error)) (lockkit.Lease, error) {
	waitCtx, cancel := WaitContext(ctx, o)
	defer cancel()
	if p.Line == nil {
		return p.poll(ctx, waitCtx, &Place{}, try)
	}
	w := p.Line.Join(p.Key, o.TTL)
	select {
	case <-w.Turn():
	case <-p.Closed:
		p.Line.Leave(w, nil, nil)
		return nil, lockkit.ErrClosed
	case <-waitCtx.Done():
		p.Line.Leave(w, nil, nil)
		return nil, WaitErr(ctx, waitCtx)
	}
	if err := w.Outage(); err != nil {
		// The head that found the outage told everyone then in line;
		// who joined since tries for itself.
		p.Line.Leave(w, nil, nil)
		return nil, err
	}
	lease, err := p.poll(ctx, waitCtx, w, try)
	var outage error
	if errors.Is(err, lockkit.ErrUnavailable) {
		outage = err
	}
	p.Line.Leave(w, lease, outage)
	return lease, err
}

// poll is the loop of a lone waiter (a place in no line) or of a line's
// head.
func (p Poller) poll(ctx, waitCtx context.Context, w *Place, try func(context.Context) (lockkit.Lease, error)) (lockkit.Lease, error) {
	backoff := p.MinDelay
	pause := func() time.Duration {
		if !p.Backoff {
			return p.MinDelay + rand.N(p.MaxDelay-p.MinDelay+1)
		}
		d := backoff/2 + rand.N(backoff/2+1)
		backoff = min(2*backoff, p.MaxDelay)
		return d
	}
	// Every remote head polls within MaxDelay: a yield that long lets one.
	pace := Pace{Closed: p.Closed, Yield: p.MaxDelay, AfterHeld: pause}
	var wait time.Duration // before the next try
	down := 0
	for {
		if err := w.Sleep(ctx, waitCtx, wait, pace); err != nil {
			return nil, err
		}
		lease, err := p.tryOnce(ctx, waitCtx, try)
		switch {
		case err != nil && waitCtx.Err() != nil:
			return nil, WaitErr(ctx, waitCtx)
		case errors.Is(err, lockkit.ErrNotAcquired):
			down = 0
			w.Refused()
		case errors.Is(err, lockkit.ErrUnavailable):
			if down++; down >= p.Outage {
				return nil, err
			}
		default:
			return lease, err
		}
		wait = pause()
	}
}

// tryOnce runs one try on the caller's context, bounded by the wait's
// deadline plus tryGrace: a grant won a little late is still used.
func (p Poller) tryOnce(ctx, waitCtx context.Context, try func(context.Context) (lockkit.Lease, error)) (lockkit.Lease, error) {
	deadline, ok := waitCtx.Deadline()
	if !ok {
		return try(waitCtx)
	}
	tryCtx, cancel := context.WithDeadline(ctx, deadline.Add(tryGrace))
	defer cancel()
	return try(tryCtx)
}
