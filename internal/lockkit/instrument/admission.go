package instrument

import (
	"fmt"
	"sync"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// admission turns lock waiters away instead of queueing them past what a
// hot key can serve.
//
// A lock serializes one key: past the rate its critical section allows,
// every extra buyer only lengthens the queue, and everyone's wait grows
// until the whole queue times out together. admission bounds, per key and
// per process, the number of requests waiting, and refuses at once a
// request whose expected wait (the waiters ahead of it in this process
// times the recent time a holder keeps the key) already exceeds its wait
// timeout; the wait timeout bounds the rest. Refusals are
// lockkit.ErrNotAcquired, which shop answers with 503 lock-busy and
// Retry-After; the buyers who are admitted keep a wait near one queue's
// length.
//
// The estimate counts only this process's waiters, so with several
// processes it is low, never high: it refuses early only what the wait
// timeout would refuse late, and never a request that would have been
// served in time.
type admission struct {
	max  int // waiters per key; 0: no bound
	mu   sync.Mutex
	keys map[string]*queue
}

// ewmaWeight is the weight of the newest hold in the estimate: enough
// history to ride over one slow hand-off, short enough to follow a load
// change within a few dozen grants.
const ewmaWeight = 0.1

// queue is one key's traffic in this process.
type queue struct {
	waiting, holding int
	// hold estimates how long a holder of this process keeps the key:
	// what each waiter ahead of a newcomer costs it at the least.
	hold     time.Duration
	lastUsed time.Time
}

func newAdmission(maxWaiters int) *admission {
	return &admission{max: maxWaiters, keys: map[string]*queue{}}
}

// enter queues a waiter for key, or refuses it when the queue is full or
// its expected wait outlasts waitTimeout (0: no estimate is used). The
// admitted waiter calls leave once its wait ended.
func (a *admission) enter(key string, waitTimeout time.Duration) (*queue, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	q := a.keys[key]
	if q == nil {
		a.sweep()
		q = &queue{}
		a.keys[key] = q
	}
	if a.max > 0 && q.waiting >= a.max {
		return nil, fmt.Errorf("%w: %d requests of this instance already wait for %s", lockkit.ErrNotAcquired, q.waiting, key)
	}
	if expected := time.Duration(q.waiting) * q.hold; waitTimeout > 0 && expected > waitTimeout {
		return nil, fmt.Errorf("%w: the wait for %s is expected to take %s, more than the %s allowed",
			lockkit.ErrNotAcquired, key, expected.Round(time.Millisecond), waitTimeout)
	}
	q.waiting++
	return q, nil
}

// leave ends q's wait: granted, the waiter now holds the key.
func (a *admission) leave(q *queue, granted bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	q.waiting--
	if granted {
		q.holding++
	}
}

// released ends a hold of q that began at granted, and learns its length.
func (a *admission) released(q *queue, granted time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
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

func (a *admission) sweep() {
	if len(a.keys) < sweepAbove {
		return
	}
	for key, q := range a.keys {
		if q.waiting == 0 && q.holding == 0 && time.Since(q.lastUsed) > idleAfter {
			delete(a.keys, key)
		}
	}
}
