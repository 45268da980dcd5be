// Package admission turns lock waiters away instead of queueing them past
// what a hot key can serve.
//
// A lock serializes one key: past the rate its critical section allows,
// every extra buyer only lengthens the queue, and everyone's wait grows
// until the whole queue times out together. Wrap bounds, per key and per
// process, the number of requests waiting, and refuses at once a request
// whose expected wait (the waiters ahead of it times the recent interval
// between grants) already exceeds its wait timeout. Refusals are
// lockkit.ErrNotAcquired, which shop answers with 503 lock-busy and
// Retry-After; the buyers who are admitted keep a wait near one queue's
// length.
package admission

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// ewmaWeight is the weight of the newest interval in the estimate: enough
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
	lastGrant        time.Time
	// interval estimates the time between two grants of the key while it
	// is contended: what each waiter ahead of a newcomer costs it.
	interval time.Duration
}

func (l *locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, _ := lockkit.Resolve(opts)
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
	if expected := time.Duration(q.waiting+q.holding) * q.interval; o.WaitTimeout > 0 && expected > o.WaitTimeout {
		l.mu.Unlock()
		return nil, fmt.Errorf("%w: the wait for %s is expected to take %s, more than the %s allowed",
			lockkit.ErrNotAcquired, key, expected.Round(time.Millisecond), o.WaitTimeout)
	}
	queued := q.waiting+q.holding > 0
	q.waiting++
	l.mu.Unlock()

	grant, err := l.Locker.Acquire(ctx, key, opts...)

	l.mu.Lock()
	defer l.mu.Unlock()
	q.waiting--
	if err != nil {
		return nil, err
	}
	now := time.Now()
	// Only a request that found the key busy measures the queue: after an
	// idle spell the gap since the last grant says nothing about the time
	// each grant takes.
	if queued && !q.lastGrant.IsZero() {
		if d := now.Sub(q.lastGrant); q.interval == 0 {
			q.interval = d
		} else {
			q.interval += time.Duration(ewmaWeight * float64(d-q.interval))
		}
	}
	q.lastGrant = now
	q.holding++
	return &lease{Lease: grant, done: func() { l.released(q) }}, nil
}

func (l *locker) released(q *queue) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q.holding--
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
		if q.waiting == 0 && q.holding == 0 && time.Since(q.lastGrant) > idleAfter {
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
