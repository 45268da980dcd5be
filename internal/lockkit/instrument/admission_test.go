package instrument_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/instrument"
	"github.com/lockbench/shop/internal/lockkit/local"
)

// TestWaitersPastTheBoundAreTurnedAway: with the key held and two requests
// waiting, a third is refused at once with ErrNotAcquired, and the two
// admitted ones are granted in turn once the holder releases.
func TestWaitersPastTheBoundAreTurnedAway(t *testing.T) {
	ctx := context.Background()
	backend := newCounting()
	defer backend.Close()
	l := instrument.Wrap(backend, instrument.Options{MaxWaiters: 2})

	holder, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	granted := make(chan error, 2)
	for range 2 {
		wg.Go(func() {
			lease, err := l.Acquire(ctx, "k")
			if err == nil {
				err = lease.Release(ctx)
			}
			granted <- err
		})
	}
	waitFor(t, func() bool { return backend.waiting() == 2 })

	// The holder never lets go while this runs: a refusal that waited
	// would hang here, not return.
	if _, err := l.Acquire(ctx, "k"); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("third waiter: %v, want ErrNotAcquired at once", err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for range 2 {
		if err := <-granted; err != nil {
			t.Errorf("admitted waiter: %v, want granted", err)
		}
	}
	// The queue is empty again: a newcomer is admitted.
	lease, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatalf("after the queue drained: %v", err)
	}
	_ = lease.Release(ctx)
}

// TestExpectedWaitPastTheTimeoutIsRefused: once holders of a key have kept
// it 40 ms each, a request that finds three waiters ahead of it expects at
// least 120 ms; with a 50 ms wait timeout it is refused at once instead of
// waiting 50 ms for nothing.
func TestExpectedWaitPastTheTimeoutIsRefused(t *testing.T) {
	ctx := context.Background()
	backend := newCounting()
	defer backend.Close()
	l := instrument.Wrap(backend, instrument.Options{})
	const hold = 40 * time.Millisecond

	// Holders teach the wrapper how long the key is kept.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			lease, err := l.Acquire(ctx, "k")
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(hold)
			_ = lease.Release(ctx)
		})
	}
	wg.Wait()

	holder, err := l.Acquire(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	waiters := make(chan struct{})
	var queued sync.WaitGroup
	for range 3 {
		queued.Go(func() {
			if lease, err := l.Acquire(ctx, "k"); err == nil {
				<-waiters
				_ = lease.Release(ctx)
			}
		})
	}
	waitFor(t, func() bool { return backend.waiting() == 3 })
	t0 := time.Now()
	_, err = l.Acquire(ctx, "k", lockkit.WithWaitTimeout(50*time.Millisecond))
	if !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("got %v, want ErrNotAcquired", err)
	}
	if waited := time.Since(t0); waited >= 50*time.Millisecond {
		t.Errorf("refused after %s: it waited out its timeout instead of being turned away", waited)
	}
	holder.Release(ctx)
	close(waiters)
	queued.Wait()
}

// TestOneSlowHoldDoesNotTurnAwayAQueue: a key's first hold took 300 ms (a
// cold database's first query), then holds took no time. Five requests
// wait behind a holder who lets go at once, and a sixth with a 1 s wait
// timeout would be served within milliseconds: one slow hold, the first
// alone or followed by fast ones, must not make it expected to wait 5 ×
// 300 ms and be turned away.
func TestOneSlowHoldDoesNotTurnAwayAQueue(t *testing.T) {
	for _, fastAfter := range []int{0, 2} {
		t.Run(fmt.Sprintf("then-%d-fast", fastAfter), func(t *testing.T) {
			ctx := context.Background()
			backend := newCounting()
			defer backend.Close()
			l := instrument.Wrap(backend, instrument.Options{})
			for i := range 1 + fastAfter {
				lease, err := l.Acquire(ctx, "k")
				if err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					time.Sleep(300 * time.Millisecond)
				}
				_ = lease.Release(ctx)
			}

			holder, err := l.Acquire(ctx, "k")
			if err != nil {
				t.Fatal(err)
			}
			var queued sync.WaitGroup
			for range 5 {
				queued.Go(func() {
					if lease, err := l.Acquire(ctx, "k"); err == nil {
						_ = lease.Release(ctx)
					}
				})
			}
			waitFor(t, func() bool { return backend.waiting() == 5 })
			sixth := make(chan error, 1)
			go func() {
				lease, err := l.Acquire(ctx, "k", lockkit.WithWaitTimeout(time.Second))
				if err == nil {
					err = lease.Release(ctx)
				}
				sixth <- err
			}()
			waitFor(t, func() bool { return backend.waiting() == 6 || len(sixth) == 1 })
			_ = holder.Release(ctx)
			if err := <-sixth; err != nil {
				t.Errorf("sixth request: %v, want served", err)
			}
			queued.Wait()
		})
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(time.Millisecond)
	}
}

// counting is the local backend with a count of the Acquires in progress,
// so that a test knows when its waiters are really waiting.
type counting struct {
	*local.Locker
	mu sync.Mutex
	n  int
}

func newCounting() *counting { return &counting{Locker: local.New()} }

func (c *counting) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	c.add(1)
	defer c.add(-1)
	return c.Locker.Acquire(ctx, key, opts...)
}

func (c *counting) add(d int) {
	c.mu.Lock()
	c.n += d
	c.mu.Unlock()
}

func (c *counting) waiting() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}
