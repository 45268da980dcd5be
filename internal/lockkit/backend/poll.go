package backend

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// Poller waits for a key by trying again after a jittered delay. It is for
// stores that cannot tell a waiter when a key is freed (Redlock, memcached):
// every waiter asks again and again, and the jitter keeps them from asking
// in step. Stores that can wake a waiter should.
type Poller struct {
	MinDelay, MaxDelay time.Duration
	// Outage is how many attempts running that could not reach the store
	// (ErrUnavailable) end the wait with that error: one timeout on a
	// loaded network is weather, several running are an outage.
	Outage int
	// Closed ends the wait with ErrClosed.
	Closed <-chan struct{}
}

// Acquire calls try with the wait's context until it grants, fails with
// something other than ErrNotAcquired, or the wait (ctx and o's wait
// timeout) ends. An attempt that fails because the wait ended reports how
// the wait ended, not the attempt's own error.
func (p Poller) Acquire(ctx context.Context, o lockkit.Options, try func(waitCtx context.Context) (lockkit.Lease, error)) (lockkit.Lease, error) {
	waitCtx, cancel := WaitContext(ctx, o)
	defer cancel()
	down := 0
	for {
		if waitCtx.Err() != nil {
			return nil, WaitErr(ctx, waitCtx)
		}
		lease, err := try(waitCtx)
		switch {
		case err != nil && waitCtx.Err() != nil:
			return nil, WaitErr(ctx, waitCtx)
		case errors.Is(err, lockkit.ErrNotAcquired):
			down = 0
		case errors.Is(err, lockkit.ErrUnavailable):
			if down++; down >= p.Outage {
				return nil, err
			}
		default:
			return lease, err
		}
		timer := time.NewTimer(p.MinDelay + rand.N(p.MaxDelay-p.MinDelay+1))
		select {
		case <-timer.C:
		case <-p.Closed:
			timer.Stop()
			return nil, lockkit.ErrClosed
		case <-waitCtx.Done():
			timer.Stop()
			return nil, WaitErr(ctx, waitCtx)
		}
	}
}
