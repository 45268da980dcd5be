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
		return p.poll(ctx, waitCtx, nil, try)
	}
	w := p.Line.join(p.Key)
	select {
	case <-w.turn:
	case <-p.Closed:
		p.Line.leave(w, nil, nil)
		return nil, lockkit.ErrClosed
	case <-waitCtx.Done():
		p.Line.leave(w, nil, nil)
		return nil, WaitErr(ctx, waitCtx)
	}
	if w.err != nil {
		// The head that found the outage told everyone then in line;
		// who joined since tries for itself.
		p.Line.leave(w, nil, nil)
		return nil, w.err
	}
	lease, err := p.poll(ctx, waitCtx, w, try)
	var outage error
	if errors.Is(err, lockkit.ErrUnavailable) {
		outage = err
	}
	p.Line.leave(w, lease, outage)
	return lease, err
}

// poll is the loop of a lone waiter (w nil) or of a line's head, which
// notes in w how its tries came about.
func (p Poller) poll(ctx, waitCtx context.Context, w *place, try func(context.Context) (lockkit.Lease, error)) (lockkit.Lease, error) {
	pw := newPollWait(p, w)
	defer pw.timer.Stop()
	var wait time.Duration // before the next try
	down := 0
	for {
		if err := pw.sleep(ctx, waitCtx, wait); err != nil {
			return nil, err
		}
		lease, err := p.tryOnce(ctx, waitCtx, try)
		switch {
		case err != nil && waitCtx.Err() != nil:
			return nil, WaitErr(ctx, waitCtx)
		case errors.Is(err, lockkit.ErrNotAcquired):
			down, pw.w.yieldUsed = 0, pw.w.yielded
		case errors.Is(err, lockkit.ErrUnavailable):
			if down++; down >= p.Outage {
				return nil, err
			}
		default:
			return lease, err
		}
		pw.w.woken, wait = false, pw.pause()
	}
}

// pollWait is what a poll waits on between its tries.
type pollWait struct {
	p       Poller
	w       *place
	nudge   <-chan bool
	held    <-chan struct{}
	timer   *time.Timer
	backoff time.Duration
}

func newPollWait(p Poller, w *place) *pollWait {
	pw := &pollWait{p: p, w: w, backoff: p.MinDelay, timer: time.NewTimer(time.Hour)}
	pw.timer.Stop()
	if w == nil {
		pw.w = &place{} // notes nobody reads
	} else {
		pw.nudge, pw.held = w.nudge, w.held
	}
	return pw
}

// pause is the next jittered delay between two tries.
func (pw *pollWait) pause() time.Duration {
	p := pw.p
	if !p.Backoff {
		return p.MinDelay + rand.N(p.MaxDelay-p.MinDelay+1)
	}
	d := pw.backoff/2 + rand.N(pw.backoff/2+1)
	pw.backoff = min(2*pw.backoff, p.MaxDelay)
	return d
}

// sleep returns when the next try is due: wait has passed, or a release
// here nudged the head. A head whose turn came with a grant here (held)
// waits without a timer: that lease's release here nudges it, and a lease
// that ends otherwise closes held. It fails if the wait ends first.
func (pw *pollWait) sleep(ctx, waitCtx context.Context, wait time.Duration) error {
	for pw.held != nil || wait > 0 {
		var tick <-chan time.Time
		if pw.held == nil {
			pw.timer.Reset(wait)
			tick = pw.timer.C
		}
		select {
		case now := <-pw.nudge:
			pw.held, pw.w.woken = nil, now
			if wait = 0; !now {
				wait = pw.p.MaxDelay // every remote head polls within it
				pw.w.yielded, pw.w.yieldUsed = true, false
			}
		case <-pw.held:
			pw.held, wait = nil, pw.pause()
		case <-tick:
			wait = 0
		case <-pw.p.Closed:
			return lockkit.ErrClosed
		case <-waitCtx.Done():
			return WaitErr(ctx, waitCtx)
		}
		pw.timer.Stop()
	}
	if waitCtx.Err() != nil {
		return WaitErr(ctx, waitCtx)
	}
	return nil
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
