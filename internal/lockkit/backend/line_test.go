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

// These tests drive a Line's logic with a map for a store; the backends'
// own tests (backend/linetest) run it against the real ones.

// slot is one key's store: who holds it, and who asked.
type slot struct {
	mu     sync.Mutex
	holder string
	tries  []string // who tried, in order
}

// locker is one process's view of the slot: a Line, and a poll so slow that
// only a release here can make a waiter try again within a test.
type locker struct {
	s      *slot
	line   backend.Line
	closed chan struct{}
}

func newLocker(s *slot) *locker { return &locker{s: s, closed: make(chan struct{})} }

const never = time.Hour

func (l *locker) acquire(ctx context.Context, who string) (lockkit.Lease, error) {
	p := backend.Poller{MinDelay: never, MaxDelay: never, Outage: 1, Closed: l.closed, Line: &l.line, Key: "k"}
	return p.Acquire(ctx, lockkit.Options{}, func(context.Context) (lockkit.Lease, error) { return l.try(who) })
}

func (l *locker) try(who string) (lockkit.Lease, error) {
	l.s.mu.Lock()
	defer l.s.mu.Unlock()
	l.s.tries = append(l.s.tries, who)
	if l.s.holder != "" {
		return nil, lockkit.ErrNotAcquired
	}
	l.s.holder = who
	return backend.NewLease(backend.Grant{Key: "k", TTL: never,
		Extend: func(context.Context, time.Duration) error { return nil },
		Release: func(context.Context) error {
			l.s.mu.Lock()
			l.s.holder = ""
			l.s.mu.Unlock()
			l.line.Released("k")
			return nil
		}}), nil
}

func (s *slot) triesBy() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.tries...)
}

type got struct {
	lease lockkit.Lease
	err   error
}

func start(ctx context.Context, l *locker, who string) <-chan got {
	ch := make(chan got, 1)
	go func() {
		lease, err := l.acquire(ctx, who)
		ch <- got{lease, err}
	}()
	return ch
}

func wait(t *testing.T, ch <-chan got) got {
	t.Helper()
	select {
	case g := <-ch:
		return g
	case <-time.After(10 * time.Second):
		t.Fatal("Acquire did not return")
		return got{}
	}
}

// quiet reports whether ch stays silent for a moment: nothing should
// happen there until the test acts.
func quiet(ch <-chan got) bool {
	select {
	case <-ch:
		return false
	case <-time.After(50 * time.Millisecond):
		return true
	}
}

// Only the head asks the store; a release here hands the key to it at
// once, and then to the next in arrival order, none of which asks the
// store while the one ahead holds the key.
func TestLineHeadAloneAsksAndReleasesHandOver(t *testing.T) {
	ctx := context.Background()
	s := &slot{holder: "elsewhere"}
	l := newLocker(s)
	var waiters []<-chan got
	for _, who := range []string{"a", "b", "c"} {
		waiters = append(waiters, start(ctx, l, who))
		time.Sleep(20 * time.Millisecond) // in line in this order
	}
	if tries := s.triesBy(); len(tries) != 1 || tries[0] != "a" {
		t.Fatalf("tries while the key is held elsewhere: %v, want only the head's one", tries)
	}
	// A release elsewhere is news only to a poll, which is an hour away;
	// free the key as if, then let a holder here release it.
	s.mu.Lock()
	s.holder = ""
	s.mu.Unlock()
	here, err := l.try("here")
	if err != nil {
		t.Fatal(err)
	}
	_ = here.Release(ctx)
	for i, w := range waiters {
		g := wait(t, w)
		if g.err != nil {
			t.Fatalf("waiter %d: %v", i, g.err)
		}
		if i+1 < len(waiters) && !quiet(waiters[i+1]) {
			t.Fatalf("waiter %d returned while %d held the key", i+1, i)
		}
		_ = g.lease.Release(ctx)
	}
	want := []string{"a", "here", "a", "b", "c"}
	if tries := s.triesBy(); !equal(tries, want) {
		t.Fatalf("tries %v, want %v: one per hand-off, none while the one ahead holds", tries, want)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// After HandOffRun hand-offs in a row, a release here leaves the key free
// for a full poll: a waiter in another process, who polls, gets it. Without
// the bound the head here, woken at once, would win every time.
func TestLineYieldsToOtherProcessesAfterHandOffRun(t *testing.T) {
	ctx := context.Background()
	s := &slot{}
	here, elsewhere := newLocker(s), newLocker(s)
	holder, err := here.acquire(ctx, "first")
	if err != nil {
		t.Fatal(err)
	}
	next := start(ctx, here, "here")
	time.Sleep(20 * time.Millisecond) // in line, behind the holder
	for i := range backend.HandOffRun {
		after := start(ctx, here, "here")
		time.Sleep(20 * time.Millisecond) // the line never empties
		_ = holder.Release(ctx)
		g := wait(t, next)
		if g.err != nil {
			t.Fatalf("hand-off %d: %v", i+1, g.err)
		}
		holder, next = g.lease, after
	}
	_ = holder.Release(ctx)
	if !quiet(next) {
		t.Fatalf("release %d here handed the key over at once; want it left for a full poll", backend.HandOffRun+1)
	}
	// What a remote head's poll finds.
	remote, err := elsewhere.try("elsewhere")
	if err != nil {
		t.Fatalf("a waiter elsewhere after %d hand-offs here: %v, want the key", backend.HandOffRun, err)
	}
	_ = remote.Release(ctx)
	close(here.closed) // the head here waits for its poll; end it
	if g := wait(t, next); !errors.Is(g.err, lockkit.ErrClosed) {
		t.Fatalf("head after Close: %v", g.err)
	}
}

// A waiter that gives up leaves the line, head or not; the next one is
// served by the next release.
func TestLineGiveUpLeaves(t *testing.T) {
	ctx := context.Background()
	s := &slot{}
	l := newLocker(s)
	holder, err := l.acquire(ctx, "holder")
	if err != nil {
		t.Fatal(err)
	}
	headCtx, cancelHead := context.WithCancel(ctx)
	midCtx, cancelMid := context.WithCancel(ctx)
	head := start(headCtx, l, "head")
	time.Sleep(20 * time.Millisecond)
	mid := start(midCtx, l, "mid")
	time.Sleep(20 * time.Millisecond)
	last := start(ctx, l, "last")
	time.Sleep(20 * time.Millisecond)
	cancelMid()
	cancelHead()
	for _, ch := range []<-chan got{head, mid} {
		if g := wait(t, ch); !errors.Is(g.err, context.Canceled) {
			t.Fatalf("waiter that gave up: %v", g.err)
		}
	}
	_ = holder.Release(ctx)
	g := wait(t, last)
	if g.err != nil {
		t.Fatal(g.err)
	}
	_ = g.lease.Release(ctx)
}

// The head's verdict that the store is down ends the wait of everyone in
// line behind it, without each asking again.
func TestLineOutageEndsTheLine(t *testing.T) {
	ctx := context.Background()
	l := &locker{closed: make(chan struct{})}
	var mu sync.Mutex
	tries := 0
	down := func(context.Context) (lockkit.Lease, error) {
		mu.Lock()
		defer mu.Unlock()
		tries++
		return nil, lockkit.ErrUnavailable
	}
	blocked := make(chan struct{})
	first := func(ctx context.Context) (lockkit.Lease, error) {
		<-blocked // the others queue behind
		return down(ctx)
	}
	p := backend.Poller{MinDelay: never, MaxDelay: never, Outage: 1, Closed: l.closed, Line: &l.line, Key: "k"}
	var results []chan error
	for i := range 4 {
		ch := make(chan error, 1)
		results = append(results, ch)
		try := down
		if i == 0 {
			try = first
		}
		go func() {
			_, err := p.Acquire(ctx, lockkit.Options{}, try)
			ch <- err
		}()
		time.Sleep(10 * time.Millisecond)
	}
	close(blocked)
	for i, ch := range results {
		select {
		case err := <-ch:
			if !errors.Is(err, lockkit.ErrUnavailable) {
				t.Fatalf("waiter %d: %v, want ErrUnavailable", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d not ended by the outage", i)
		}
	}
	if tries != 1 {
		t.Fatalf("%d tries, want the head's one", tries)
	}
}

// A head whose turn came with a grant here waits for that lease without
// asking the store. If it gives up, the one behind it takes over the same
// knowledge: the key is still held here, by the same lease. Instead the
// next head gets its turn with nothing to wait on and asks the store at
// once, and (on a real backend) every 2-10 ms until the holder releases:
// each give-up of a waiting head restores a poller the line exists to
// remove.
func TestLineGiveUpOfWaitingHeadKeepsNextFromPolling(t *testing.T) {
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
func TestLineLateReleasedDoesNotWakeHeadWaitingForNewerLease(t *testing.T) {
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
