package lockkit

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestWatch: the watched context ends with ErrLeaseLost when the lease is
// lost, and stop ends the watch (and the context) when it was not.
func TestWatch(t *testing.T) {
	lost := NewLease(Grant{Key: "k", TTL: 20 * time.Millisecond, Release: func(context.Context) error { return nil }})
	ctx, stop := Watch(context.Background(), lost)
	<-ctx.Done()
	if err := context.Cause(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("cause %v, want ErrLeaseLost", err)
	}
	stop()

	held := NewLease(Grant{Key: "k", TTL: time.Hour, Release: func(context.Context) error { return nil }})
	ctx, stop = Watch(context.Background(), held)
	if ctx.Err() != nil {
		t.Fatal("a held lease's context ended")
	}
	stop()
	if err := context.Cause(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("cause after stop %v, want Canceled", err)
	}
	_ = held.Release(context.Background())
}
