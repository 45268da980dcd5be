package lockkit

import (
	"context"
	"time"
)

// Option tunes one Acquire or TryAcquire.
type Option func(*Options)

// Options is the resolved set of options. Backends read it through
// backend.Resolve.
type Options struct {
	// TTL is the lease length. Zero means DefaultLeaseTTL renewed by the
	// watchdog; a TTL given with WithTTL is never renewed by lockkit.
	TTL time.Duration
	// WaitTimeout bounds Acquire's wait; zero waits until ctx is done.
	WaitTimeout time.Duration
	// AutoRenew is set by WithAutoRenew: the watchdog renews TTL.
	AutoRenew bool
	// Unfenced is set by WithoutFence.
	Unfenced bool
	// Class is set by WithClass, KeyClass by WithKeyClass; backends
	// ignore both.
	Class    string
	KeyClass func(key string) string
}

// WithTTL sets an explicit lease length and turns the watchdog off: the lease
// ends after ttl unless the holder calls Extend.
func WithTTL(ttl time.Duration) Option {
	return func(o *Options) { o.TTL, o.AutoRenew = ttl, false }
}

// WithAutoRenew sets the lease length and keeps the watchdog on: the lease
// is renewed every ttl/3 while its holder lives. A short ttl notices a
// vanished lease sooner, at the price of more renewals.
func WithAutoRenew(ttl time.Duration) Option {
	return func(o *Options) { o.TTL, o.AutoRenew = ttl, true }
}

// WithWaitTimeout bounds how long Acquire waits before ErrNotAcquired.
func WithWaitTimeout(d time.Duration) Option { return func(o *Options) { o.WaitTimeout = d } }

// WithoutFence asks for a grant without a fencing token, for a caller whose
// store cannot check one: a backend that pays for its token (Redis: a
// counter and the server clock) may then skip it, and the lease's Fence()
// is 0. DoFenced, whose store does check, refuses it (ErrUnfenced).
func WithoutFence() Option { return func(o *Options) { o.Unfenced = true } }

// WithClass names the kind of thing the key guards (stock, account), for
// wrappers that measure or trace acquisitions by class: one series per key
// would grow without bound, and a key is not parsed back into its class.
func WithClass(class string) Option { return func(o *Options) { o.Class = class } }

// WithKeyClass names the class of each key of a call that takes keys of
// several classes (DoMany: an order locks its stock and its account).
func WithKeyClass(class func(key string) string) Option {
	return func(o *Options) { o.KeyClass = class }
}

// ClassOf is the class opts name for key (WithKeyClass, else WithClass),
// "" if none.
func ClassOf(key string, opts []Option) string {
	var o Options
	for _, opt := range opts {
		opt(&o)
	}
	if o.KeyClass != nil {
		if c := o.KeyClass(key); c != "" {
			return c
		}
	}
	return o.Class
}

type ownerKey struct{}

// WithOwner marks ctx with an explicit owner for reentrancy. Go has no thread
// identity, so the caller names the owner: the same owner acquiring a key it
// already holds through the same Locker nests instead of deadlocking.
func WithOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

// OwnerFrom returns the owner set by WithOwner, if any.
func OwnerFrom(ctx context.Context) (string, bool) {
	owner, ok := ctx.Value(ownerKey{}).(string)
	return owner, ok && owner != ""
}
