package lockkit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// chanLease is a lease lost when lose is called.
type chanLease struct {
	lost chan struct{}
	once sync.Once
}

func (l *chanLease) lose()                                       { l.once.Do(func() { close(l.lost) }) }
func (l *chanLease) Key() string                                 { return "k" }
func (l *chanLease) Fence() uint64                               { return 1 }
func (l *chanLease) Lost() <-chan struct{}                       { return l.lost }
func (l *chanLease) Extend(context.Context, time.Duration) error { return nil }
func (l *chanLease) Release(context.Context) error               { l.lose(); return nil }

// TestWatch: the watched context ends with ErrLeaseLost when the lease is
// lost, and stop ends the watch (and the context) when it was not.
func TestWatch(t *testing.T) {
	lease := &chanLease{lost: make(chan struct{})}
	ctx, stop := lockkit.Watch(context.Background(), lease)
	lease.lose()
	<-ctx.Done()
	if err := context.Cause(ctx); !errors.Is(err, lockkit.ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", err)
	}
	stop()

	held := &chanLease{lost: make(chan struct{})}
	ctx, stop = lockkit.Watch(context.Background(), held)
	if ctx.Err() != nil {
		t.Fatal("a held lease's context ended")
	}
	stop()
	if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cause after stop %v, want Canceled", err)
	}
	_ = held.Release(context.Background()) // after stop: no cancel with ErrLeaseLost
	if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cause after release %v, want Canceled", err)
	}
}
