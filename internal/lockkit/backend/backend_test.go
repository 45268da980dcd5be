package backend_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		name     string
		opts     []lockkit.Option
		ttl      time.Duration
		watchdog bool
	}{
		{"default", nil, lockkit.DefaultLeaseTTL, true},
		{"WithTTL", []lockkit.Option{lockkit.WithTTL(time.Second)}, time.Second, false},
		{"WithAutoRenew", []lockkit.Option{lockkit.WithAutoRenew(time.Second)}, time.Second, true},
		{"WithTTL-zero", []lockkit.Option{lockkit.WithTTL(0)}, lockkit.DefaultLeaseTTL, true},
		// The last option wins, as its doc says: WithTTL turns the watchdog off.
		{"WithAutoRenew-then-WithTTL", []lockkit.Option{lockkit.WithAutoRenew(time.Minute), lockkit.WithTTL(time.Second)}, time.Second, false},
		{"WithTTL-then-WithAutoRenew", []lockkit.Option{lockkit.WithTTL(time.Second), lockkit.WithAutoRenew(time.Minute)}, time.Minute, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, watchdog := backend.Resolve(tc.opts)
			if o.TTL != tc.ttl || watchdog != tc.watchdog {
				t.Fatalf("Resolve = TTL %v watchdog %v, want %v %v", o.TTL, watchdog, tc.ttl, tc.watchdog)
			}
		})
	}
	o, _ := backend.Resolve([]lockkit.Option{lockkit.WithWaitTimeout(time.Second)})
	if o.WaitTimeout != time.Second {
		t.Fatalf("Resolve = %+v, want the wait timeout", o)
	}
}

// A wait ends with ErrNotAcquired when its own timeout runs out and with
// the caller's error when the caller's context ends first.
func TestWaitContextAndWaitErr(t *testing.T) {
	o := lockkit.Options{WaitTimeout: 10 * time.Millisecond}
	wait, cancel := backend.WaitContext(context.Background(), o)
	defer cancel()
	<-wait.Done()
	if err := backend.WaitErr(context.Background(), wait); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("wait timeout: WaitErr = %v, want ErrNotAcquired", err)
	}

	parent, stop := context.WithCancel(context.Background())
	wait, cancel = backend.WaitContext(parent, lockkit.Options{WaitTimeout: time.Minute})
	defer cancel()
	stop()
	<-wait.Done()
	if err := backend.WaitErr(parent, wait); !errors.Is(err, context.Canceled) {
		t.Fatalf("caller cancelled: WaitErr = %v, want context.Canceled", err)
	}

	wait, cancel = backend.WaitContext(context.Background(), lockkit.Options{})
	if _, ok := wait.Deadline(); ok {
		t.Fatal("no wait timeout, yet the wait has a deadline")
	}
	cancel()
	if err := backend.WaitErr(context.Background(), wait); !errors.Is(err, context.Canceled) {
		t.Fatalf("wait cancelled by the backend: WaitErr = %v, want its cause", err)
	}
}

func TestIsClosed(t *testing.T) {
	ch := make(chan struct{})
	if backend.IsClosed(ch) || backend.IsClosed(nil) {
		t.Fatal("an open or nil channel reported closed")
	}
	close(ch)
	if !backend.IsClosed(ch) {
		t.Fatal("a closed channel reported open")
	}
}
