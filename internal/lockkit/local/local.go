// Package local is a lockkit backend inside one process: a map of keys
// guarded by a mutex. It has everything a lock needs (TTL, owner check,
// fencing, waiting without polling) except reach: two processes never see
// each other's grants. Use it for one instance, and as the reference the
// conformance suite measures the distributed backends against.
package local

import (
	"context"
	"sync"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// Locker is the in-process backend.
type Locker struct {
	mu     sync.Mutex
	keys   map[string]*entry
	tokens uint64
	closed chan struct{}
	once   sync.Once
	// op, if set, is called on every store operation: the conformance
	// suite counts a waiter's calls with it, as it counts network calls
	// of the other backends.
	op func()
}

// entry outlives its grants so the fence keeps rising: one entry per key
// ever locked, a few dozen bytes each.
type entry struct {
	owner   uint64 // 0 when free
	fence   uint64
	expires time.Time
	freed   chan struct{} // closed and replaced on every release
}

// New returns an empty in-process Locker.
func New() *Locker {
	return &Locker{keys: make(map[string]*entry), closed: make(chan struct{})}
}

// Capabilities of the in-process backend.
func (l *Locker) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{Fencing: true, WaitNoPoll: true, LostSignal: true, Expires: true, OwnerCheck: true}
}

func (l *Locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, watchdog := backend.Resolve(opts)
	waitCtx, cancel := backend.WaitContext(ctx, o)
	defer cancel()
	for {
		lease, freed, wake, err := l.try(key, o.TTL, watchdog)
		if err != nil || lease != nil {
			return lease, err
		}
		timer := time.NewTimer(wake)
		select {
		case <-freed:
		case <-timer.C: // the holder's TTL ran out without a release
		case <-l.closed:
		case <-waitCtx.Done():
			timer.Stop()
			return nil, backend.WaitErr(ctx, waitCtx)
		}
		timer.Stop()
	}
}

func (l *Locker) TryAcquire(_ context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, watchdog := backend.Resolve(opts)
	lease, _, _, err := l.try(key, o.TTL, watchdog)
	if err == nil && lease == nil {
		err = lockkit.ErrNotAcquired
	}
	return lease, err
}

// try grants key if it is free or expired; otherwise it returns what to wait
// on: the release signal and the time left on the holder's lease.
func (l *Locker) try(key string, ttl time.Duration, watchdog bool) (lockkit.Lease, <-chan struct{}, time.Duration, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.op != nil {
		l.op()
	}
	select {
	case <-l.closed:
		return nil, nil, 0, lockkit.ErrClosed
	default:
	}
	e := l.keys[key]
	if e == nil {
		e = &entry{freed: make(chan struct{})}
		l.keys[key] = e
	}
	now := time.Now()
	if e.owner != 0 && now.Before(e.expires) {
		return nil, e.freed, e.expires.Sub(now), nil
	}
	l.tokens++
	owner := l.tokens
	e.owner, e.expires = owner, now.Add(ttl)
	// Floored at the clock, as Redis's are: a restarted process starts a
	// new Locker, and its tokens must beat those its predecessor left in
	// the stores.
	e.fence = max(e.fence+1, uint64(now.UnixMicro()))
	return backend.NewLease(backend.Grant{
		Key: key, Fence: e.fence, TTL: ttl, Watchdog: watchdog, Sent: now,
		Extend:  func(_ context.Context, ttl time.Duration) error { return l.extend(key, owner, ttl) },
		Release: func(context.Context) error { return l.release(key, owner) },
		Closed:  l.closed,
	}), nil, 0, nil
}

func (l *Locker) extend(key string, owner uint64, ttl time.Duration) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.op != nil {
		l.op()
	}
	e := l.keys[key]
	now := time.Now()
	if e.owner != owner || !now.Before(e.expires) {
		return lockkit.ErrNotHeld
	}
	e.expires = now.Add(ttl)
	return nil
}

func (l *Locker) release(key string, owner uint64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.op != nil {
		l.op()
	}
	e := l.keys[key]
	if e.owner != owner || !time.Now().Before(e.expires) {
		return lockkit.ErrNotHeld
	}
	e.owner = 0
	close(e.freed)
	e.freed = make(chan struct{})
	return nil
}

// Steal frees key whoever holds it, as an operator deleting a lock would.
// The conformance suite uses it to check that the holder notices.
func (l *Locker) Steal(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e := l.keys[key]; e != nil && e.owner != 0 {
		e.owner = 0
		close(e.freed)
		e.freed = make(chan struct{})
	}
}

// Close stops every lease's watchdog; waiters get ErrClosed.
func (l *Locker) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}
