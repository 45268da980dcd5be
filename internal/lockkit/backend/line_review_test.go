package backend_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// A head whose turn came with a grant here waits for that lease without
// asking the store. If it gives up, the one behind it takes over the same
// knowledge: the key is still held here, by the same lease. Instead the
// next head gets its turn with nothing to wait on and asks the store at
// once, and (on a real backend) every 2-10 ms until the holder releases:
// each give-up of a waiting head restores a poller the line exists to
// remove.
func TestReviewLineGiveUpOfWaitingHeadKeepsNextFromPolling(t *testing.T) {
	ctx := context.Background()
	s := &slot{holder: "elsewhere"}
	l := newLocker(s)
	a := start(ctx, l, "a")
	time.Sleep(20 * time.Millisecond)
	bctx, giveUp := context.WithCancel(ctx)
	b := start(bctx, l, "b")
	time.Sleep(20 * time.Millisecond)
	c := start(ctx, l, "c")
	time.Sleep(20 * time.Millisecond)
	// Free the key elsewhere and hand it to a by a release here.
	s.mu.Lock()
	s.holder = ""
	s.mu.Unlock()
	here, err := l.try("here")
	if err != nil {
		t.Fatal(err)
	}
	_ = here.Release(ctx)
	ga := wait(t, a)
	if ga.err != nil {
		t.Fatal(ga.err)
	}
	time.Sleep(20 * time.Millisecond) // b is head, waiting for a's lease
	giveUp()
	if g := wait(t, b); !errors.Is(g.err, context.Canceled) {
		t.Fatalf("b: %v", g.err)
	}
	time.Sleep(50 * time.Millisecond)
	tries := s.triesBy()
	if want := []string{"a", "here", "a"}; !equal(tries, want) {
		t.Errorf("tries while a holds the key here: %v, want %v: c asked the store though a's lease, "+
			"which b was waiting for, still holds it", tries, want)
	}
	_ = ga.lease.Release(ctx)
	gc := wait(t, c)
	if gc.err != nil {
		t.Fatal(gc.err)
	}
	_ = gc.lease.Release(ctx)
}

// A release tells the line after the store freed the key. If the head's
// own poll wins the key in between (its pause after the lease it waited
// for closed Lost is as short as MinDelay/2 with Backoff), the late
// Released nudges the next head, which is waiting for the lease just
// granted here: it asks the store at once and then polls through the whole
// critical section of the holder ahead of it.
func TestReviewLineLateReleasedDoesNotWakeHeadWaitingForNewerLease(t *testing.T) {
	ctx := context.Background()
	var mu sync.Mutex
	holder := "elsewhere"
	var tries []string
	var line backend.Line
	gate := make(chan struct{})
	gated := true
	p := backend.Poller{MinDelay: time.Millisecond, MaxDelay: time.Millisecond, Outage: 1, Line: &line, Key: "k"}
	acquire := func(who string) <-chan got {
		ch := make(chan got, 1)
		go func() {
			lease, err := p.Acquire(ctx, lockkit.Options{}, func(context.Context) (lockkit.Lease, error) {
				mu.Lock()
				defer mu.Unlock()
				tries = append(tries, who)
				if holder != "" {
					return nil, lockkit.ErrNotAcquired
				}
				holder = who
				wait := gated
				gated = false // only the first lease's release is slow to tell
				return backend.NewLease(backend.Grant{Key: "k", TTL: time.Hour,
					Extend: func(context.Context, time.Duration) error { return nil },
					Release: func(context.Context) error {
						mu.Lock()
						holder = ""
						mu.Unlock()
						if wait {
							<-gate // the release's reply is on its way
						}
						line.Released("k")
						return nil
					}}), nil
			})
			ch <- got{lease, err}
		}()
		time.Sleep(20 * time.Millisecond) // in line in this order
		return ch
	}
	triesBy := func(who string) int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, w := range tries {
			if w == who {
				n++
			}
		}
		return n
	}
	a := acquire("a")
	b := acquire("b")
	c := acquire("c")
	mu.Lock()
	holder = "" // freed elsewhere: a's poll finds it
	mu.Unlock()
	ga := wait(t, a)
	if ga.err != nil {
		t.Fatal(ga.err)
	}
	released := make(chan error, 1)
	go func() { released <- ga.lease.Release(ctx) }()
	gb := wait(t, b) // b's poll wins before the line hears of the release
	if gb.err != nil {
		t.Fatal(gb.err)
	}
	time.Sleep(20 * time.Millisecond) // c is head, waiting for b's lease
	before := triesBy("c")
	close(gate)
	<-released
	time.Sleep(50 * time.Millisecond)
	if n := triesBy("c") - before; n != 0 {
		t.Errorf("c asked the store %d times while b's lease, which it waits for, holds the key: "+
			"a's late Released woke it", n)
	}
	_ = gb.lease.Release(ctx)
	gc := wait(t, c)
	if gc.err != nil {
		t.Fatal(gc.err)
	}
	_ = gc.lease.Release(ctx)
}
