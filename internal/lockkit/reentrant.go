package lockkit

import (
	"context"
	"sync"
	"time"
)

// Reentrant makes l reentrant for owners named with WithOwner: an owner that
// already holds a key through this Locker gets a nested lease at once, and
// the key is released when the last nested lease is. Contexts without an
// owner pass straight through. The hold count lives in this process, which
// is where the owner's identity lives too.
//
// A nested lease is the same grant and carries the same fence. A store
// that admits each token once (shop's claim-then-write) refuses a second
// update under it: make one store update per grant, not one per nesting.
func Reentrant(l Locker) Locker {
	return &reentrant{inner: l, held: make(map[holdKey]*hold)}
}

type holdKey struct{ owner, key string }

type hold struct {
	lease Lease
	count int
}

type reentrant struct {
	inner Locker
	mu    sync.Mutex
	held  map[holdKey]*hold
}

func (r *reentrant) Acquire(ctx context.Context, key string, opts ...Option) (Lease, error) {
	return r.acquire(ctx, key, opts, r.inner.Acquire)
}

func (r *reentrant) TryAcquire(ctx context.Context, key string, opts ...Option) (Lease, error) {
	return r.acquire(ctx, key, opts, r.inner.TryAcquire)
}

func (r *reentrant) acquire(ctx context.Context, key string, opts []Option,
	grant func(context.Context, string, ...Option) (Lease, error)) (Lease, error) {
	owner, ok := OwnerFrom(ctx)
	if !ok {
		return grant(ctx, key, opts...)
	}
	k := holdKey{owner, key}
	r.mu.Lock()
	if h, ok := r.held[k]; ok && !closed(h.lease.Lost()) {
		h.count++
		r.mu.Unlock()
		return &nested{r: r, k: k, h: h}, nil
	}
	r.mu.Unlock()

	lease, err := grant(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	h := &hold{lease: lease, count: 1}
	r.mu.Lock()
	r.held[k] = h
	r.mu.Unlock()
	return &nested{r: r, k: k, h: h}, nil
}

func (r *reentrant) Close() error { return r.inner.Close() }

// Capabilities reports the inner backend's, plus reentrancy.
func (r *reentrant) Capabilities() Capabilities {
	c := CapabilitiesOf(r.inner)
	c.Reentrant = true
	return c
}

// Unwrap returns the backend under the reentrancy layer.
func (r *reentrant) Unwrap() Locker { return r.inner }

type nested struct {
	r *reentrant
	k holdKey
	h *hold

	mu       sync.Mutex
	released bool
}

func (n *nested) Key() string           { return n.h.lease.Key() }
func (n *nested) Fence() uint64         { return n.h.lease.Fence() }
func (n *nested) Lost() <-chan struct{} { return n.h.lease.Lost() }

func (n *nested) Extend(ctx context.Context, ttl time.Duration) error {
	return n.h.lease.Extend(ctx, ttl)
}

func (n *nested) Release(ctx context.Context) error {
	n.mu.Lock()
	if n.released {
		n.mu.Unlock()
		return ErrNotHeld
	}
	n.released = true
	n.mu.Unlock()

	n.r.mu.Lock()
	n.h.count--
	last := n.h.count == 0
	if last && n.r.held[n.k] == n.h {
		delete(n.r.held, n.k)
	}
	n.r.mu.Unlock()
	if !last {
		return nil
	}
	return n.h.lease.Release(ctx)
}
