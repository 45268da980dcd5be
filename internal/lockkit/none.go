package lockkit

import (
	"context"
	"time"
)

// None grants every request at once and excludes nothing. It is the unsafe
// baseline that shows, in tests and load tests, what the other backends
// prevent. Its fence is always 0, so fenced stores do not refuse its writes.
func None() Locker { return noLocker{} }

type noLocker struct{}

func (noLocker) Acquire(_ context.Context, key string, _ ...Option) (Lease, error) {
	return noLease{key: key, lost: make(chan struct{})}, nil
}

func (n noLocker) TryAcquire(ctx context.Context, key string, opts ...Option) (Lease, error) {
	return n.Acquire(ctx, key, opts...)
}

func (noLocker) Close() error { return nil }

// Capabilities: none at all.
func (noLocker) Capabilities() Capabilities { return Capabilities{} }

type noLease struct {
	key  string
	lost chan struct{}
}

func (l noLease) Key() string                               { return l.key }
func (noLease) Fence() uint64                               { return 0 }
func (l noLease) Lost() <-chan struct{}                     { return l.lost }
func (noLease) Extend(context.Context, time.Duration) error { return nil }
func (noLease) Release(context.Context) error               { return nil }
