// Package guard is the one way shop runs a flow under locks: take the keys
// of the rows the flow touches (sorted, so that two flows never wait on
// each other in a cycle), hand their fencing tokens to the flow as an
// argument, and count the writes a fence refused by class. Each key is
// taken with its class (lockkit.WithKeyClass), which the metrics and the
// traces label it by.
//
// The flow gives its store the tokens explicitly, in the shape of
// wild-workouts' UpdateHour: the caller supplies the change, the store
// supplies the atomicity and the fencing check:
//
//	err := g.Do(ctx, []lockkey.Key{k}, func(ctx context.Context, f guard.Fences) error {
//		return store.Update(ctx, id, f.Of(k), func(ctx context.Context, row *Row) error { … })
//	})
//
// With lockkit.None() the same code is the unsafe baseline: every token is
// 0 and the stores write unchecked.
package guard

import (
	"context"
	"errors"
	"time"

	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/instrument"
)

// FencedDomain is a domain whose stores keep fencing tokens in their rows.
// ForgetFences sets them back to 0; the app calls it only when the lock
// server restarted empty and nobody else can reach it (the embedded
// Redis): its counters start over, and the old fences would refuse every
// write. Every domain the app wires must implement it, so that a new
// fenced domain cannot be forgotten; a domain whose fences live beside
// the lock counters (likes in Redis) forgets nothing.
type FencedDomain interface {
	ForgetFences(ctx context.Context) error
}

// Locking is what every domain takes to lock its changes. The app builds
// one and hands the same value to every domain, whose Options embed it.
// Any field may be left zero.
type Locking struct {
	// Locker takes the keys; lockkit.None() is the unsafe baseline. New
	// takes nil as None; a domain may refuse nil instead, so that a
	// forgotten Locker does not pass for the baseline (like.New does).
	Locker lockkit.Locker
	// LockOptions are passed to every acquisition (TTL, wait timeout).
	// A guard never writes to the slice, so every domain may share one.
	LockOptions []lockkit.Option
	// Metrics, if not nil, counts the writes a fence refused.
	Metrics *instrument.Metrics
	// CriticalSectionDelay stands in for the business work between a
	// change's read and its write (SHOP_CRITICAL_SECTION_DELAY), in every
	// strategy, locked or not; the flows spend it through Work.
	CriticalSectionDelay time.Duration
}

// Guard runs one domain's flows under its locks. It is safe for concurrent
// use.
type Guard struct {
	class   lockkey.Class
	locker  lockkit.Locker
	opts    []lockkit.Option
	metrics *instrument.Metrics
}

// New returns the guard of a domain whose refused writes count under
// class, taking its keys with l's Locker and LockOptions and counting in
// l's Metrics. l's CriticalSectionDelay is the flows' own to spend.
func New(class lockkey.Class, l Locking) *Guard {
	locker := l.Locker
	if locker == nil {
		locker = lockkit.None()
	}
	return &Guard{class: class, locker: locker, opts: l.LockOptions, metrics: l.Metrics}
}

// Fences are the tokens of the grants a flow holds, by key.
type Fences map[lockkey.Key]uint64

// Of is k's token: 0 when the backend cannot fence (or is none), or when
// the flow does not hold k; a store writes unchecked with 0.
func (f Fences) Of(k lockkey.Key) uint64 { return f[k] }

// Do runs fn holding every key, with the grants' tokens. fn's context is
// cancelled with lockkit.ErrLeaseLost as soon as a lease is lost, so fn
// can stop before writing. fn's stores check its writes against the
// tokens, so a change fn reports done stands whatever became of the
// leases after it: Do returns nil when fn did (lockkit.DoManyFenced). A
// write a fence refused (lockkit.ErrFenced) is counted under the guard's
// class.
func (g *Guard) Do(ctx context.Context, keys []lockkey.Key, fn func(ctx context.Context, f Fences) error) error {
	err := lockkit.DoManyFenced(ctx, g.locker, lockkey.Strings(keys), func(ctx context.Context, tokens map[string]uint64) error {
		f := make(Fences, len(keys))
		for _, k := range keys {
			f[k] = tokens[k.String()]
		}
		return fn(ctx, f)
	}, g.options(keys)...)
	if g.metrics != nil && errors.Is(err, lockkit.ErrFenced) {
		g.metrics.Fenced(g.class)
	}
	return err
}

// Hold runs fn holding every key, for a read that must not see a change
// half-way. Nothing is written, so nothing is fenced: a lease lost while
// fn ran makes Hold return lockkit.ErrLeaseLost (lockkit.DoMany).
func (g *Guard) Hold(ctx context.Context, keys []lockkey.Key, fn func(ctx context.Context) error) error {
	return lockkit.DoMany(ctx, g.locker, lockkey.Strings(keys), func(ctx context.Context, _ map[string]uint64) error {
		return fn(ctx)
	}, g.options(keys)...)
}

// options are the guard's, with each of keys' class, in a new array: the
// guard's are shared by every flow running at once.
func (g *Guard) options(keys []lockkey.Key) []lockkit.Option {
	classes := make(map[string]string, len(keys))
	for _, k := range keys {
		classes[k.String()] = string(k.Class())
	}
	class := func(key string) string { return classes[key] }
	return append(g.opts[:len(g.opts):len(g.opts)], lockkit.WithKeyClass(class))
}

// Work stands in for the business work between a flow's read and its
// write (SHOP_CRITICAL_SECTION_DELAY), widening the window a lock must
// close. It stops early, with the context's cause (lockkit.ErrLeaseLost
// when the lease was lost), if ctx ends.
func Work(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
