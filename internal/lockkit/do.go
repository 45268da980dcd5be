package lockkit

import (
	"context"
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
// Do returns fn's error. If fn returned nil, its work is done and Do returns
// nil even when the release then finds the lease already expired: reporting
// a failure then would invite a retry of work that already happened.
func Do(ctx context.Context, l Locker, key string, fn func(ctx context.Context, fence uint64) error, opts ...Option) error {
	lease, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		return err
	}
	fnCtx, cancel := context.WithCancelCause(ctx)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case <-lease.Lost():
			cancel(ErrLeaseLost)
		case <-fnCtx.Done():
		}
	}()
	err = fn(fnCtx, lease.Fence())
	cancel(nil)
	<-watchDone

	release := func() {
		relCtx, relCancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer relCancel()
		_ = lease.Release(relCtx)
	}
	select {
	case <-lease.Lost():
		// The release may not get through (a partition is a common reason
		// to lose a lease); the caller's answer must not wait for it.
		go release()
	default:
		release()
	}
	return err
}

// DoMany runs fn holding every key, acquired in sorted order so that two
// callers locking the same keys in any order never deadlock. fn receives each
// key's fence. Duplicate keys are locked once.
func DoMany(ctx context.Context, l Locker, keys []string, fn func(ctx context.Context, fences map[string]uint64) error, opts ...Option) error {
	sorted := sortedUnique(keys)
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
