package inventory

import (
	"context"
	"errors"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/lockmetrics"
)

type fenceKey struct{}

// withFence hands the grant's fencing token down to readCheckWrite.
func withFence(ctx context.Context, fence uint64) context.Context {
	return context.WithValue(ctx, fenceKey{}, fence)
}

// fenceFrom is the token withFence set; 0 (unfenced) when none was.
func fenceFrom(ctx context.Context) uint64 {
	f, _ := ctx.Value(fenceKey{}).(uint64)
	return f
}

// locked runs each purchase under lock:stock:<sku>.
type locked struct {
	next   Service
	locker lockkit.Locker
	opts   []lockkit.Option
	store  *Store
}

func (l *locked) Get(ctx context.Context, sku string) (Product, error) { return l.next.Get(ctx, sku) }

func (l *locked) Purchase(ctx context.Context, user int64, sku string, quantity int64) (p Purchase, err error) {
	if err := validate(sku, quantity); err != nil {
		return Purchase{}, err
	}
	// Unknown SKUs are turned away before they name a lock: a backend keeps
	// a fence counter for every key ever locked.
	if _, err := l.store.Get(ctx, sku); err != nil {
		return Purchase{}, err
	}
	err = lockkit.DoFenced(ctx, l.locker, Key(sku), func(ctx context.Context, fence uint64) error {
		p, err = l.next.Purchase(withFence(ctx, fence), user, sku, quantity)
		return err
	}, l.opts...)
	return p, err
}

// instrumented counts the writes a fence refused.
type instrumented struct {
	next Service
	m    *lockmetrics.Metrics
}

func (i *instrumented) Get(ctx context.Context, sku string) (Product, error) {
	return i.next.Get(ctx, sku)
}

func (i *instrumented) Purchase(ctx context.Context, user int64, sku string, quantity int64) (Purchase, error) {
	p, err := i.next.Purchase(ctx, user, sku, quantity)
	if errors.Is(err, lockkit.ErrFenced) {
		i.m.Fenced("stock")
	}
	return p, err
}
