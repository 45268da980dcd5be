package backend_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit/backend"
)

// A lease whose TTL has run out reads as lost the first time anyone looks
// at Lost, even if nobody looked before: callers check it with a select
// and a default (lockkit.Do after fn, Reentrant before nesting) and must
// not be told a dead lease is still trusted.
func TestLostClosedWhenFirstAskedAfterDeadline(t *testing.T) {
	for range 20 {
		l := backend.NewLease(backend.Grant{
			Key: "k", Fence: 1, TTL: 10 * time.Millisecond,
			Extend:  func(context.Context, time.Duration) error { return nil },
			Release: func(context.Context) error { return nil },
		})
		time.Sleep(30 * time.Millisecond)
		if !backend.IsClosed(l.Lost()) {
			t.Fatal("Lost still open 20ms past the lease's deadline")
		}
	}
}

// The goroutine that watches a grant's Gone ends when the lease's TTL runs
// out, also for a lease nobody releases or watches (a session-long Gone,
// as zklock and etcdlock pass, would otherwise keep one per lease alive).
func TestGoneWatcherEndsAtDeadline(t *testing.T) {
	gone := make(chan struct{})
	defer close(gone)
	time.Sleep(10 * time.Millisecond)
	before := runtime.NumGoroutine()
	for range 10 {
		backend.NewLease(backend.Grant{
			Key: "k", Fence: 1, TTL: 10 * time.Millisecond, Gone: gone,
			Extend:  func(context.Context, time.Duration) error { return nil },
			Release: func(context.Context) error { return nil },
		})
	}
	time.Sleep(100 * time.Millisecond)
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines 90ms after 10 leases ran out, %d before", n, before)
	}
}
