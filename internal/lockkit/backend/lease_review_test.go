package backend_test

import (
	"context"
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
