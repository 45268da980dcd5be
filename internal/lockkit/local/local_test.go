package local_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/lockkit/locktest"
)

func TestConformance(t *testing.T) {
	// One store shared by every client, as one process shares one Locker.
	var (
		store   = local.New()
		clients = func(testing.TB) lockkit.Locker { return newClient(store) }
	)
	locktest.Run(t, locktest.Harness{
		New:   clients,
		Steal: func(_ testing.TB, key string) { store.Steal(key) },
		// No network: the store counts its operations on the wire.
		Wired: func(_ testing.TB, w *locktest.Wire) lockkit.Locker {
			store.CountOps(w.CountCall)
			return newClient(store)
		},
		TTL: 200 * time.Millisecond,
	})
}

// client hands the suite a view of one store, the way several goroutines
// of one process share a Locker. Closing the view ends its own waits, not
// the store.
type client struct {
	*local.Locker
	closed context.Context
	close  context.CancelFunc
}

func newClient(store *local.Locker) client {
	ctx, cancel := context.WithCancel(context.Background())
	return client{store, ctx, cancel}
}

func (c client) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer context.AfterFunc(c.closed, cancel)()
	lease, err := c.Locker.Acquire(ctx, key, opts...)
	if c.closed.Err() != nil && err != nil {
		return nil, lockkit.ErrClosed
	}
	return lease, err
}

func (c client) Close() error {
	c.close()
	return nil
}

// A process that restarts starts a new Locker; the stores keep the fences
// the last one issued. Its tokens must still beat them, or every fenced
// write to a row locked before the restart would be refused.
func TestFencesOfANewLockerBeatAnEarlierOnes(t *testing.T) {
	ctx := context.Background()
	before := local.New()
	var last uint64
	for range 3 {
		lease, err := before.Acquire(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		last = lease.Fence()
		_ = lease.Release(ctx)
	}
	before.Close()

	after := local.New()
	defer after.Close()
	lease, err := after.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(ctx)
	if lease.Fence() <= last {
		t.Fatalf("the restarted Locker's first token %d does not beat the last one issued before, %d", lease.Fence(), last)
	}
}
