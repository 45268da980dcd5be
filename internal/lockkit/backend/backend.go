// Package backend is what a lockkit backend is built from, as
// database/sql/driver is what a database driver is built from. It is for
// the authors of backends and of Lockers that wrap one; code that only
// takes locks needs lockkit alone.
//
// A backend resolves the caller's options with Resolve, waits under
// WaitContext and answers WaitErr when the wait ends, queues its waiters
// in a Line (one waiter per Locker and key talks to the store, and a
// release in the process reaches the next one at once), polls with a
// Poller if its store cannot wake a waiter, and hands every grant to
// NewLease, which gives all backends the same watchdog, Lost signal and
// local expiry. Redis needs no Line: its waiters queue in Redis itself.
// Work a
// backend leaves running after its caller returned goes through a Group,
// which Close waits for.
package backend

import (
	"context"

	"github.com/lockbench/shop/internal/lockkit"
)

// Resolve applies opts over the defaults. Watchdog reports whether the lease
// must be renewed in the background: no explicit TTL was given, or
// WithAutoRenew asked for it.
func Resolve(opts []lockkit.Option) (o lockkit.Options, watchdog bool) {
	for _, opt := range opts {
		opt(&o)
	}
	if o.TTL <= 0 {
		o.TTL, o.AutoRenew = lockkit.DefaultLeaseTTL, true
	}
	return o, o.AutoRenew
}

// WaitContext derives the context Acquire waits under: ctx bounded by o's
// wait timeout, if one was given.
func WaitContext(ctx context.Context, o lockkit.Options) (context.Context, context.CancelFunc) {
	if o.WaitTimeout > 0 {
		return context.WithTimeoutCause(ctx, o.WaitTimeout, lockkit.ErrNotAcquired)
	}
	return context.WithCancel(ctx)
}

// WaitErr turns the error of a wait that ended with its context into what
// Acquire returns: ErrNotAcquired when the wait timeout ran out, ctx.Err()
// when the caller's own context ended.
func WaitErr(parent, wait context.Context) error {
	if err := parent.Err(); err != nil {
		return err
	}
	if cause := context.Cause(wait); cause != nil {
		return cause
	}
	return lockkit.ErrNotAcquired
}

// IsClosed reports whether ch is closed, without waiting. A nil channel is
// never closed.
func IsClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
