package backend

import (
	"context"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// Pace is how a head spaces its looks at the store between the news that
// makes it look at once.
type Pace struct {
	// Closed ends the wait with ErrClosed.
	Closed <-chan struct{}
	// Yield is how long a head leaves the key to the waiters elsewhere
	// after a release here ended a run, before it looks itself; news from
	// the store (Wake) ends it early. A polling store's waiters elsewhere
	// all ask within their longest poll; a store that tells its waiters
	// needs only a fallback for news that does not come.
	Yield time.Duration
	// AfterHeld is when the head looks after the lease it waited out has
	// ended without news from here (lost, or its release has yet to tell
	// the line), unless a release here nudges it first.
	AfterHeld func() time.Duration
}

// Sleep returns when the head p should look at the store next: wait has
// passed, a release here nudged it (at once, or after pace.Yield if it
// ended a run), a grant was handed to it (Take), or the store had news
// (Wake). A head that waits out a lease held here (Held) waits without a
// timer until a release here nudges it, or until pace.AfterHeld after that
// lease ended otherwise. It fails if the wait ends first.
func (p *Place) Sleep(ctx, waitCtx context.Context, wait time.Duration, pace Pace) error {
	p.woken = false
	for p.waitsOut() || wait > 0 {
		var held <-chan struct{}
		var tick <-chan time.Time
		if p.waitsOut() {
			held = p.held
		} else {
			tick = p.startTimer(wait)
		}
		select {
		case n := <-p.nudge:
			p.heldOut, wait = true, p.heard(n, pace)
		case <-held:
			p.heldOut, wait = true, pace.AfterHeld()
		case <-tick:
			wait = 0
		case <-pace.Closed:
			return lockkit.ErrClosed
		case <-waitCtx.Done():
			return WaitErr(ctx, waitCtx)
		}
		if p.timer != nil {
			p.timer.Stop()
		}
	}
	if waitCtx.Err() != nil {
		return WaitErr(ctx, waitCtx)
	}
	return nil
}

// waitsOut reports whether the head still waits out the lease held here
// that its turn came with.
func (p *Place) waitsOut() bool { return p.held != nil && !p.heldOut }

func (p *Place) startTimer(d time.Duration) <-chan time.Time {
	// Since Go 1.23 neither Reset nor Stop can leave a stale tick behind.
	if p.timer == nil {
		p.timer = time.NewTimer(d)
	} else {
		p.timer.Reset(d)
	}
	return p.timer.C
}

// heard notes a nudge and returns how long to wait before looking.
func (p *Place) heard(n nudge, pace Pace) time.Duration {
	switch n {
	case tryNow:
		p.woken = true
	case yield:
		p.yielded, p.yieldUsed = true, false
		return pace.Yield
	case news:
		// Everyone was told: a yield then races the waiters elsewhere on
		// equal terms, which says nothing of whether they want the key.
		p.yieldUsed = p.yielded
	}
	return 0
}
