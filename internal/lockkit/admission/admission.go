// Package admission turns lock waiters away instead of queueing them past
// what a hot key can serve.
//
// A lock serializes one key: past the rate its critical section allows,
// every extra buyer only lengthens the queue, and everyone's wait grows
// until the whole queue times out together. Wrap bounds, per key and per
// process, the number of requests waiting, and refuses at once a request
// whose expected wait (the waiters ahead of it in this process times the
// recent time a holder keeps the key) already exceeds its wait timeout;
// the wait timeout bounds the rest. Refusals are lockkit.ErrNotAcquired,
// which shop answers with 503 lock-busy and Retry-After; the buyers who
// are admitted keep a wait near one queue's length.
//
// The estimate counts only this process's waiters, so with several
// processes it is low, never high: it refuses early only what the wait
// timeout would refuse late, and never a request that would have been
// served in time.
package admission

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// ewmaWeight is the weight of the newest hold in the estimate: enough
// history to ride over one slow hand-off, short enough to follow a load
// change within a few dozen grants.
const ewmaWeight = 0.1

// Wrap bounds next's waiters to maxWaiters per key in this process (0: no
// bound) and refuses a wait that is expected to outlast the acquisition's
// wait timeout (lockkit.WithWaitTimeout; none: no estimate is used).
func Wrap(next lockkit.Locker, maxWaiters int) lockkit.Locker {
	return &locker{Locker: next, max: maxWaiters, keys: map[string]*queue{}}
}

type locker struct {
	lockkit.Locker
	max  int
	mu   sync.Mutex
	keys map[string]*queue
}

// queue is one key's traffic in this process.
type queue struct {
	waiting, holding int
	// hold estimates how long a holder of this process keeps the key:
	// what each waiter ahead of a newcomer costs it at the least.
	hold     time.Duration
	lastUsed time.Time
}

func (l *locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, _ := backend.Resolve(opts)
	l.mu.Lock()
	q := l.keys[key]
	if q == nil {
		l.sweep()
		q = &queue{}
		l.keys[key] = q
	}
	if l.max > 0 && q.waiting >= l.max {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: %d requests of this instance already wait for %s", lockkit.ErrNotAcquired, q.waiting, key)
	}
	if expected := time.Duration(q.waiting) * q.hold; o.WaitTimeout > 0 && expected > o.WaitTimeout {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: the wait for %s is expected to take %s, more than the %s allowed",
			lockkit.ErrNotAcquired, key, expected.Round(time.Millisecond), o.WaitTimeout)
	}
	q.waiting++
	l.mu.Unlock()

	grant, err := l.Locker.Acquire(ctx, key, opts...)

	l.mu.Lock()
	defer l.mu.Unlock()
	q.waiting--
	if err != nil {
		return nil, err
	}
	q.holding++
	granted := time.Now()
	return &lease{Lease: grant, done: func() { l.released(q, granted) }}, nil
}

func (l *locker) released(q *queue, granted time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q.holding--
	now := time.Now()
	if d := now.Sub(granted); q.hold == 0 {
		q.hold = d
	} else {
		q.hold += time.Duration(ewmaWeight * float64(d-q.hold))
	}
	q.lastUsed = now
}

// Keys idle for idleAfter are dropped once the map holds sweepAbove of
// them: an idle key's estimate is stale anyway, and the keys (SKUs,
// accounts) are as many as the clients like.
const (
	sweepAbove = 4096
	idleAfter  = time.Minute
)

func (l *locker) sweep() {
	if len(l.keys) < sweepAbove {
		return
	}
	for key, q := range l.keys {
		if q.waiting == 0 && q.holding == 0 && time.Since(q.lastUsed) > idleAfter {
			delete(l.keys, key)
		}
	}
}

// Capabilities passes the backend's declaration through.
func (l *locker) Capabilities() lockkit.Capabilities { return lockkit.CapabilitiesOf(l.Locker) }

type lease struct {
	lockkit.Lease
	once sync.Once
	done func()
}

func (l *lease) Release(ctx context.Context) error {
	err := l.Lease.Release(ctx)
	l.once.Do(l.done)
	return err
}
