package lockkit

import (
	"context"
	"errors"
	"slices"
	"time"
)

// releaseTimeout bounds the release Do makes after fn, which runs on a
// context detached from the caller's: a cancelled request must still free
// its lock rather than leave it to expire. After a lost lease the release
// runs in the background, ended by this same bound.
const releaseTimeout = 5 * time.Second

// Do runs fn while holding key. fn's context is cancelled with cause
// ErrLeaseLost as soon as the lease is lost, so fn can stop before writing;
// a store that checks fence refuses the writes of an fn that does not.
//
// Do returns fn's error if fn failed, or ErrLeaseLost for an fn that
// stopped with its context's context.Canceled when the lease was lost. If
// fn returned nil after its lease was lost, Do returns ErrLeaseLost: fn's work ran at least partly without
// the lock, and only the writes a store checked against fence are known to
// be in order. A lease that is already lost when granted (a reply slower
// than its TTL) is not handed to fn at all: Do returns ErrLeaseLost. A
// release that finds the lease expired after fn returned in time is not
// an error: the work was done under the lock.
func Do(ctx context.Context, l Locker, key string, fn func(ctx context.Context, fence uint64) error, opts ...Option) error {
	lease, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	release := func() {
		relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer relCancel()
		_ = lease.Release(relCtx)
	}
	if closed(lease.Lost()) {
		go release()
		return ErrLeaseLost
	}
	fnCtx, stopWatch := Watch(holdContext(ctx, lease), lease)
	err = fn(fnCtx, lease.Fence())
	stopWatch()

	if closed(lease.Lost()) {
		// The release may not get through (a partition is a common reason
		// to lose a lease); the caller's answer must not wait for it.
		go release()
		// context.Canceled from fn (a driver's, say) tells only that its
		// context ended; while the caller's lives, the lease's loss did it.
		if err == nil || errors.Is(err, context.Canceled) && ctx.Err() == nil {
			err = ErrLeaseLost
		}
		return err
	}
	release()
	return err
}

// DoMany runs fn holding every key, acquired in sorted order so that two
// callers locking the same keys in any order never deadlock. fn receives each
// key's fence. Duplicate keys are locked once.
func DoMany(ctx context.Context, l Locker, keys []string, fn func(ctx context.Context, fences map[string]uint64) error, opts ...Option) error {
	sorted := slices.Compact(slices.Sorted(slices.Values(keys)))
	fences := make(map[string]uint64, len(sorted))
	var run func(ctx context.Context, i int) error
	run = func(ctx context.Context, i int) error {
		if i == len(sorted) {
			return fn(ctx, fences)
		}
		return Do(ctx, l, sorted[i], func(ctx context.Context, fence uint64) error {
			fences[sorted[i]] = fence
			return run(ctx, i+1)
		}, opts...)
	}
	return run(ctx, 0)
}

// DoFenced is Do for an fn whose every write is checked by its store
// against fence (claimed before the read, written only while the row still
// carries the token). A write such a store accepted carried a token no
// later holder had beaten, so it stands whatever became of the lease after
// it: DoFenced returns nil when fn did, where Do returns ErrLeaseLost, which
// a caller would answer as "nothing was changed" about a change that
// landed. A backend that cannot fence passes 0 and the store writes
// unchecked; that write landed too, and the same holds. Asked WithoutFence,
// it refuses at once with ErrUnfenced.
func DoFenced(ctx context.Context, l Locker, key string, fn func(ctx context.Context, fence uint64) error, opts ...Option) error {
	if unfenced(opts) {
		return ErrUnfenced
	}
	var done bool
	err := Do(ctx, l, key, func(ctx context.Context, fence uint64) error {
		err := fn(ctx, fence)
		done = err == nil
		return err
	}, opts...)
	return landed(done, err)
}

// DoManyFenced is DoMany with DoFenced's answer.
func DoManyFenced(ctx context.Context, l Locker, keys []string, fn func(ctx context.Context, fences map[string]uint64) error, opts ...Option) error {
	if unfenced(opts) {
		return ErrUnfenced
	}
	var done bool
	err := DoMany(ctx, l, keys, func(ctx context.Context, fences map[string]uint64) error {
		err := fn(ctx, fences)
		done = err == nil
		return err
	}, opts...)
	return landed(done, err)
}

func landed(done bool, err error) error {
	if done {
		return nil
	}
	return err
}

func unfenced(opts []Option) bool {
	var o Options
	for _, opt := range opts {
		opt(&o)
	}
	return o.Unfenced
}

// holdContext is the context Do runs fn with: ctx, with what the lease
// adds to it when it has something to add (cmd/shop's tracing puts the
// span of the lock hold there, so that fn's work is traced inside it).
func holdContext(ctx context.Context, lease Lease) context.Context {
	if h, ok := lease.(interface {
		HoldContext(context.Context) context.Context
	}); ok {
		return h.HoldContext(ctx)
	}
	return ctx
}

// Watch is how Do watches its lease, exported for work under a lease
// whose life is not one function call: it derives from ctx a context that
// is cancelled with cause ErrLeaseLost as soon as lease is lost. stop ends
// the watch and cancels the context; call it when the work is done and
// before the lease is released (a release closes Lost). It returns once
// the watch has ended, so no goroutine outlives it.
func Watch(ctx context.Context, lease Lease) (watched context.Context, stop func()) {
	watched, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-lease.Lost():
			cancel(ErrLeaseLost)
		case <-watched.Done():
		}
	}()
	return watched, func() { cancel(nil); <-done }
}

// closed is backend.IsClosed, which lockkit cannot import: backend imports
// lockkit.
func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
