package idem

import (
	"context"
	"sync"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// runLease is a running request's hold on its key, kept by lockkit's lease
// machinery rather than a watchdog of idem's own: renewed every third of
// Options.Lease, and lost once a renewal finds the key claimed by a later
// run, or once a whole lease has passed since the last renewal that was
// sent and applied. The lease is not a lock: it is fenced by the record's
// run, not by a counter (so its Fence is 0), and it ends by storing the
// response or freeing the key, which run does after end.
type runLease struct {
	lockkit.Lease
	mu sync.Mutex
	// ended: the request finished; no renewal may land after this, or it
	// would set the lease again on a key just stored or freed.
	ended bool
	// claimedAgain: a renewal found the record naming a later run.
	claimedAgain bool
}

// lease starts the lease of run on recKey, claimed at claimed (Redis
// started it later than that, so claimed+Lease is never late).
func (m *Idem) lease(recKey, leaseKey, run string, claimed time.Time) *runLease {
	r := &runLease{}
	r.Lease = backend.NewLease(backend.Grant{
		Key: leaseKey, TTL: m.o.Lease, Watchdog: true, Sent: claimed,
		Extend: func(ctx context.Context, ttl time.Duration) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.ended {
				return lockkit.ErrNotHeld
			}
			ok, err := renewScript.Run(ctx, m.client, []string{recKey, leaseKey}, run, ttl.Milliseconds()).Int()
			switch {
			case err != nil:
				// Transient: the next tick tries again, and the lease is lost
				// if none succeeds in time.
				return err
			case ok == 0:
				r.claimedAgain = true
				return lockkit.ErrNotHeld
			}
			return nil
		},
		// Nothing to free here: run stores the response or frees the key.
		Release: func(context.Context) error { return nil },
	})
	return r
}

// why is the reason the lease was lost, for the log.
func (r *runLease) why() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.claimedAgain {
		return "the key was claimed again"
	}
	return "no renewal for a whole lease"
}

// end stops the renewals, waiting for one in flight: after end, nothing
// renews the lease in Redis.
func (r *runLease) end(ctx context.Context) {
	_ = r.Release(ctx) // cancels a renewal in flight
	r.mu.Lock()
	r.ended = true
	r.mu.Unlock()
}
