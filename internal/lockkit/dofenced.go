package lockkit

import "context"

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
