package account

import (
	"context"
	"errors"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/lockmetrics"
)

type fencesKey struct{}

// withFences hands the grants' fencing tokens down to core, which passes
// them to the store. A context is how a decorator can add them without a
// second, fence-taking version of every Service method.
func withFences(ctx context.Context, f map[int64]uint64) context.Context {
	return context.WithValue(ctx, fencesKey{}, f)
}

// fencesFrom returns the tokens withFences set; nil (every token 0,
// unfenced) when no lock decorator ran.
func fencesFrom(ctx context.Context) map[int64]uint64 {
	f, _ := ctx.Value(fencesKey{}).(map[int64]uint64)
	return f
}

// locked runs every change under the lock of each account it touches.
type locked struct {
	next   Service
	locker lockkit.Locker
	opts   []lockkit.Option
	store  *Store
}

// exist turns unknown accounts away before they name a lock: a backend
// keeps a fence counter for every key ever locked, and a transfer's
// recipient is any number the client likes.
func (l *locked) exist(ctx context.Context, ids ...int64) error {
	for _, id := range ids {
		if _, err := l.store.Get(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// Get reads without a lock: a read alone cannot lose an update, and a
// balance read a moment before a write is as good as one read just after.
func (l *locked) Get(ctx context.Context, id int64) (Account, error) { return l.next.Get(ctx, id) }

func (l *locked) Deposit(ctx context.Context, id, amount int64) (a Account, err error) {
	if err := l.exist(ctx, id); err != nil {
		return Account{}, err
	}
	err = lockkit.DoFenced(ctx, l.locker, Key(id), func(ctx context.Context, fence uint64) error {
		a, err = l.next.Deposit(withFences(ctx, map[int64]uint64{id: fence}), id, amount)
		return err
	}, l.opts...)
	return a, err
}

func (l *locked) Withdraw(ctx context.Context, id, amount int64) (a Account, err error) {
	if err := l.exist(ctx, id); err != nil {
		return Account{}, err
	}
	err = lockkit.DoFenced(ctx, l.locker, Key(id), func(ctx context.Context, fence uint64) error {
		a, err = l.next.Withdraw(withFences(ctx, map[int64]uint64{id: fence}), id, amount)
		return err
	}, l.opts...)
	return a, err
}

// Transfer locks both accounts; DoMany takes them in sorted order, so two
// transfers in opposite directions never wait on each other in a cycle.
func (l *locked) Transfer(ctx context.Context, from, to, amount int64) (t Transfer, err error) {
	if from == to {
		return l.next.Transfer(ctx, from, to, amount) // refused there; no lock needed
	}
	if err := refuseUnaffordable(ctx, l.store, from, amount); err != nil {
		return Transfer{}, err
	}
	if err := l.exist(ctx, from, to); err != nil {
		return Transfer{}, err
	}
	keys := []string{Key(from), Key(to)}
	err = lockkit.DoManyFenced(ctx, l.locker, keys, func(ctx context.Context, fences map[string]uint64) error {
		f := map[int64]uint64{from: fences[Key(from)], to: fences[Key(to)]}
		t, err = l.next.Transfer(withFences(ctx, f), from, to, amount)
		return err
	}, l.opts...)
	return t, err
}

// instrumented counts the writes a fence refused.
type instrumented struct {
	next Service
	m    *lockmetrics.Metrics
}

func (i *instrumented) count(err error) {
	if errors.Is(err, lockkit.ErrFenced) {
		i.m.Fenced("account")
	}
}

func (i *instrumented) Get(ctx context.Context, id int64) (Account, error) {
	return i.next.Get(ctx, id)
}

func (i *instrumented) Deposit(ctx context.Context, id, amount int64) (Account, error) {
	a, err := i.next.Deposit(ctx, id, amount)
	i.count(err)
	return a, err
}

func (i *instrumented) Withdraw(ctx context.Context, id, amount int64) (Account, error) {
	a, err := i.next.Withdraw(ctx, id, amount)
	i.count(err)
	return a, err
}

func (i *instrumented) Transfer(ctx context.Context, from, to, amount int64) (Transfer, error) {
	t, err := i.next.Transfer(ctx, from, to, amount)
	i.count(err)
	return t, err
}
