package backend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

var poller = backend.Poller{MinDelay: time.Millisecond, MaxDelay: 2 * time.Millisecond, Outage: 3}

func granted() lockkit.Lease {
	return backend.NewLease(backend.Grant{Key: "k", TTL: time.Minute,
		Extend:  func(context.Context, time.Duration) error { return nil },
		Release: func(context.Context) error { return nil }})
}

// tries answers with errs in turn, then grants.
func tries(errs ...error) (func(context.Context) (lockkit.Lease, error), *int) {
	n := new(int)
	return func(context.Context) (lockkit.Lease, error) {
		*n++
		if *n <= len(errs) {
			return nil, errs[*n-1]
		}
		return granted(), nil
	}, n
}

func TestPollerTriesUntilGranted(t *testing.T) {
	try, n := tries(lockkit.ErrNotAcquired, lockkit.ErrNotAcquired, lockkit.ErrUnavailable, lockkit.ErrUnavailable, lockkit.ErrNotAcquired)
	lease, err := poller.Acquire(context.Background(), lockkit.Options{}, try)
	if err != nil || lease == nil {
		t.Fatalf("Acquire = %v", err)
	}
	if *n != 6 {
		t.Fatalf("%d tries, want 6", *n)
	}
	_ = lease.Release(context.Background())
}

// Outage attempts running that could not reach the store end the wait;
// a reachable answer in between starts the count again.
func TestPollerGivesUpAfterAnOutage(t *testing.T) {
	down := lockkit.ErrUnavailable
	try, n := tries(down, down, lockkit.ErrNotAcquired, down, down, down)
	if _, err := poller.Acquire(context.Background(), lockkit.Options{}, try); !errors.Is(err, down) {
		t.Fatalf("Acquire = %v, want ErrUnavailable", err)
	}
	if *n != 6 {
		t.Fatalf("%d tries, want 6", *n)
	}
}

func TestPollerReturnsOtherErrorsAtOnce(t *testing.T) {
	boom := errors.New("boom")
	try, n := tries(boom)
	if _, err := poller.Acquire(context.Background(), lockkit.Options{}, try); !errors.Is(err, boom) || *n != 1 {
		t.Fatalf("Acquire = %v after %d tries, want boom after 1", err, *n)
	}
}

func TestPollerEndsWithItsWait(t *testing.T) {
	busy := func(context.Context) (lockkit.Lease, error) { return nil, lockkit.ErrNotAcquired }
	o := lockkit.Options{WaitTimeout: 20 * time.Millisecond}
	if _, err := poller.Acquire(context.Background(), o, busy); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("wait timeout: %v, want ErrNotAcquired", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := poller.Acquire(ctx, lockkit.Options{}, busy); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("caller's deadline: %v, want DeadlineExceeded", err)
	}
	closed := make(chan struct{})
	close(closed)
	p := poller
	p.Closed = closed
	if _, err := p.Acquire(context.Background(), lockkit.Options{}, busy); !errors.Is(err, lockkit.ErrClosed) {
		t.Fatalf("closed Locker: %v, want ErrClosed", err)
	}
}

// Every retry waits between MinDelay and MaxDelay: the jitter spreads the
// waiters, and never turns the poll into a busy loop.
func TestPollerWaitsBetweenTries(t *testing.T) {
	p := backend.Poller{MinDelay: 20 * time.Millisecond, MaxDelay: 30 * time.Millisecond, Outage: 3}
	var at []time.Time
	try := func(context.Context) (lockkit.Lease, error) {
		at = append(at, time.Now())
		if len(at) < 4 {
			return nil, lockkit.ErrNotAcquired
		}
		return granted(), nil
	}
	lease, err := p.Acquire(context.Background(), lockkit.Options{}, try)
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	for i := 1; i < len(at); i++ {
		if gap := at[i].Sub(at[i-1]); gap < p.MinDelay {
			t.Fatalf("try %d came %v after the one before, under MinDelay %v", i+1, gap, p.MinDelay)
		}
	}
}
