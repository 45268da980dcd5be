package backend

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// A yield nobody used doubles the run of hand-offs; one that another
// process used brings it back to HandOffRun.
func TestLineRunFollowsTheYields(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	holder := ""
	var line Line
	p := Poller{MinDelay: 5 * time.Millisecond, MaxDelay: 5 * time.Millisecond, Outage: 1, Line: &line, Key: "k"}
	try := func(context.Context) (lockkit.Lease, error) {
		mu.Lock()
		defer mu.Unlock()
		if holder != "" {
			return nil, lockkit.ErrNotAcquired
		}
		holder = "here"
		return NewLease(Grant{Key: "k", TTL: time.Hour,
			Extend: func(context.Context, time.Duration) error { return nil },
			Release: func(context.Context) error {
				mu.Lock()
				holder = ""
				mu.Unlock()
				line.Released("k")
				return nil
			}}), nil
	}
	run := func() int {
		line.mu.Lock()
		defer line.mu.Unlock()
		return max(line.keys["k"].run, HandOffRun)
	}
	acquire := func() <-chan lockkit.Lease {
		ch := make(chan lockkit.Lease, 1)
		go func() {
			lease, err := p.Acquire(ctx, lockkit.Options{}, try)
			if err != nil {
				t.Error(err)
			}
			ch <- lease
		}()
		time.Sleep(10 * time.Millisecond) // in line
		return ch
	}
	lease, err := p.Acquire(ctx, lockkit.Options{}, try)
	if err != nil {
		t.Fatal(err)
	}
	next := acquire()
	// grants releases lease n times, a waiter always behind the next.
	grants := func(n int) {
		for range n {
			after := acquire()
			_ = lease.Release(ctx)
			lease, next = <-next, after
		}
	}
	// The first hand-off may race the head's poll; from then on each head
	// waits for the lease ahead without polling.
	grants(1)
	line.mu.Lock()
	done := line.keys["k"].handOffs
	line.mu.Unlock()
	grants(HandOffRun - done + 1) // the last after a yield nobody used
	if got := run(); got != 2*HandOffRun {
		t.Fatalf("run after an unused yield: %d, want %d", got, 2*HandOffRun)
	}
	grants(2*HandOffRun + 1)
	if got := run(); got != 4*HandOffRun {
		t.Fatalf("run after two unused yields: %d, want %d", got, 4*HandOffRun)
	}
	grants(4 * HandOffRun)
	// The yield: another process takes the key before the head here polls.
	after := acquire()
	_ = lease.Release(ctx)
	mu.Lock()
	if holder != "" {
		mu.Unlock()
		t.Fatal("a yield handed the key over at once")
	}
	holder = "elsewhere"
	mu.Unlock()
	time.Sleep(20 * time.Millisecond) // the head here polls, refused
	mu.Lock()
	holder = ""
	mu.Unlock()
	lease, next = <-next, after
	if got := run(); got != HandOffRun {
		t.Fatalf("run after a yield somebody used: %d, want %d", got, HandOffRun)
	}
	_ = lease.Release(ctx)
	_ = (<-next).Release(ctx)
}
