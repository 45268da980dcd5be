package lockkit

import "context"

// WithKeyPrefix namespaces every key of l, for backends that have no prefix
// option of their own: several services or test runs can then share one
// lock server. Leases report the key as the caller passed it.
func WithKeyPrefix(l Locker, prefix string) Locker {
	if prefix == "" {
		return l
	}
	return prefixed{l, prefix}
}

type prefixed struct {
	Locker
	prefix string
}

func (p prefixed) Acquire(ctx context.Context, key string, opts ...Option) (Lease, error) {
	return p.wrap(key)(p.Locker.Acquire(ctx, p.prefix+key, opts...))
}

func (p prefixed) TryAcquire(ctx context.Context, key string, opts ...Option) (Lease, error) {
	return p.wrap(key)(p.Locker.TryAcquire(ctx, p.prefix+key, opts...))
}

func (p prefixed) wrap(key string) func(Lease, error) (Lease, error) {
	return func(l Lease, err error) (Lease, error) {
		if err != nil {
			return nil, err
		}
		return prefixedLease{l, key}, nil
	}
}

// Capabilities passes the backend's declaration through.
func (p prefixed) Capabilities() Capabilities {
	return CapabilitiesOf(p.Locker)
}

type prefixedLease struct {
	Lease
	key string
}

func (l prefixedLease) Key() string { return l.key }
