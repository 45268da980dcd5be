package locktest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

func (s *suite) cancelWhileWaiting(t *testing.T) {
	key := s.key(t)
	a, b, c := s.open(t), s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithTTL(30*time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	go func() {
		lease, err := b.Acquire(ctx, key)
		if lease != nil {
			_ = lease.Release(context.Background())
		}
		result <- err
	}()
	time.Sleep(200 * time.Millisecond) // let b start waiting
	cancel()
	select {
	case err := <-result:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire after cancel = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not return after its context was cancelled while the holder kept the lock")
	}
	// The cancelled waiter must leave nothing behind that delays others.
	if err := la.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	lc := mustAcquire(t, c, key, lockkit.WithWaitTimeout(5*time.Second))
	_ = lc.Release(context.Background())
}

func (s *suite) waitTimeout(t *testing.T) {
	key := s.key(t)
	a, b := s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithTTL(30*time.Second))
	defer la.Release(context.Background())
	_, err := b.Acquire(context.Background(), key, lockkit.WithWaitTimeout(100*time.Millisecond))
	if !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("Acquire past its wait timeout = %v, want ErrNotAcquired", err)
	}
}

func (s *suite) tryAcquireHeld(t *testing.T) {
	key := s.key(t)
	a, b := s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithTTL(30*time.Second))
	defer la.Release(context.Background())
	// The holder keeps the key for 30 s; TryAcquire must answer long before.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a held key = %v, want ErrNotAcquired", err)
	}
}

// fairOrder holds the backend to Capabilities.Fair. Waiters arrive one
// by one, several per Locker and interleaved between Lockers (a queue kept
// per process is not arrival order), and a newcomer tries the key the
// moment it is released. Declared fair: grants follow arrival and the
// newcomer is never served first. Not declared: some round must show it.
func (s *suite) fairOrder(t *testing.T) {
	lockers := []lockkit.Locker{s.open(t), s.open(t)}
	holder, newcomer := s.open(t), s.open(t)
	arrivals := []int{0, 0, 1, 1, 0, 1} // the Locker each waiter uses
	// A Locker's first call may dial a connection, which under load takes
	// longer than the spacing of arrivals: each one's first call comes
	// here, so that the spacing covers only queuing.
	for i, l := range append([]lockkit.Locker{holder, newcomer}, lockers...) {
		lease := mustTry(t, l, fmt.Sprintf("%s:warm%d", s.key(t), i), lockkit.WithTTL(30*time.Second))
		if err := lease.Release(context.Background()); err != nil {
			t.Fatalf("warming Locker %d: release: %v", i, err)
		}
	}
	rounds := 1
	if !s.caps.Fair {
		rounds = 5
	}
	for r := range rounds {
		got := s.fairRound(t, fmt.Sprintf("%s:%d", s.key(t), r), holder, newcomer, lockers, arrivals)
		inOrder := slices.IsSorted(got)
		switch {
		case s.caps.Fair && !inOrder:
			t.Fatalf("backend declares fair order; arrivals 0..%d (Lockers %v, newcomer %d) were granted %v",
				len(arrivals)-1, arrivals, len(arrivals), got)
		case !s.caps.Fair && !inOrder:
			t.Logf("absent as declared: round %d granted %v", r, got)
			return
		}
	}
	if !s.caps.Fair {
		t.Fatalf("backend declares no fair order, but %d rounds were each granted in arrival order, "+
			"newcomer included: declare Fair, or show where it breaks", rounds)
	}
}

// fairRound returns the arrival numbers in grant order; the newcomer is
// number len(arrivals) and appears only if it was granted.
func (s *suite) fairRound(t *testing.T, key string, holder, newcomer lockkit.Locker, lockers []lockkit.Locker, arrivals []int) []int {
	ctx := context.Background()
	lh := mustTry(t, holder, key, lockkit.WithTTL(30*time.Second))
	order := make(chan int, len(arrivals)+1)
	var wg sync.WaitGroup
	for i, li := range arrivals {
		l := lockers[li]
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			lease, err := l.Acquire(wctx, key, lockkit.WithTTL(30*time.Second))
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			order <- i
			_ = lease.Release(ctx)
		})
		time.Sleep(150 * time.Millisecond) // waiter i is queued before i+1 arrives (Lockers warmed)
	}
	_ = lh.Release(ctx)
	ln, err := newcomer.TryAcquire(ctx, key, lockkit.WithTTL(30*time.Second))
	switch {
	case err == nil:
		order <- len(arrivals)
		_ = ln.Release(ctx)
	case !errors.Is(err, lockkit.ErrNotAcquired):
		t.Fatalf("newcomer's TryAcquire: %v", err)
	}
	wg.Wait()
	close(order)
	var got []int
	for i := range order {
		got = append(got, i)
	}
	if t.Failed() {
		t.FailNow()
	}
	return got
}

// handOff measures how soon a waiter gets a released key, so the
// backends table can show what waiting without polling is worth. It is
// reported, not asserted: the machines are shared and noisy.
func (s *suite) handOff(t *testing.T) {
	key := s.key(t)
	a, b := s.open(t), s.open(t)
	var samples []time.Duration
	for range 10 {
		la := mustTry(t, a, key, lockkit.WithTTL(30*time.Second))
		got := make(chan time.Time, 1)
		go func() {
			lb, err := b.Acquire(context.Background(), key, lockkit.WithTTL(30*time.Second))
			granted := time.Now()
			if err == nil {
				_ = lb.Release(context.Background())
			}
			got <- granted
		}()
		time.Sleep(20 * time.Millisecond)
		released := time.Now()
		_ = la.Release(context.Background())
		samples = append(samples, (<-got).Sub(released))
	}
	slices.Sort(samples)
	t.Logf("release-to-grant of a waiting client: median %v, max %v (WaitNoPoll declared: %v)",
		samples[len(samples)/2], samples[len(samples)-1], s.caps.WaitNoPoll)
}
