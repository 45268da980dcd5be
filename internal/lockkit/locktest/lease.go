package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

func (s *suite) ownerCheckedRelease(t *testing.T) {
	if !s.caps.OwnerCheck {
		t.Fatal("every backend but none must check the owner")
	}
	ctx := context.Background()
	key := s.key(t)
	a, b, c := s.open(t), s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithTTL(s.h.TTL))
	<-la.Lost() // a's lease ran out: b may now take the key
	lb := mustAcquire(t, b, key, lockkit.WithTTL(10*time.Second))
	if err := la.Release(ctx); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("release by a former holder = %v, want ErrNotHeld", err)
	}
	if err := la.Extend(ctx, time.Minute); err == nil {
		t.Fatal("extend by a former holder succeeded")
	}
	if lc, err := c.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		if lc != nil {
			_ = lc.Release(ctx)
		}
		t.Fatalf("after a non-owner's release, TryAcquire = %v, want ErrNotAcquired: the release freed another holder's lock", err)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatalf("release by the holder: %v", err)
	}
	if err := lb.Release(ctx); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("second release = %v, want ErrNotHeld", err)
	}
	lc := mustTry(t, c, key)
	_ = lc.Release(ctx)
}

func (s *suite) extend(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	a, b := s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithTTL(s.h.TTL))
	if err := la.Extend(ctx, 4*s.h.TTL); err != nil {
		t.Fatalf("extend: %v", err)
	}
	time.Sleep(2 * s.h.TTL) // past the first TTL, within the extension
	select {
	case <-la.Lost():
		t.Fatal("Lost closed within the extended lease")
	default:
	}
	if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("TryAcquire within the extended lease = %v, want ErrNotAcquired", err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// extendAfterTakeover reaches the store's owner check: the key is taken
// away and granted to another client while the first holder's Lost is
// still open (its TTL is long), so the lease cannot answer from what it
// knows and must ask the store.
func (s *suite) extendAfterTakeover(t *testing.T) {
	if s.h.Steal == nil {
		t.Fatal("Harness.Steal is required: every backend's grants can be deleted by an operator")
	}
	ctx := context.Background()
	key := s.key(t)
	a, b, c := s.open(t), s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithTTL(time.Minute))
	s.h.Steal(t, key)
	bTTL := 4 * s.h.TTL
	lb := mustAcquire(t, b, key, lockkit.WithTTL(bTTL))
	defer lb.Release(ctx)
	lostFirst := backend.IsClosed(la.Lost())
	err := la.Extend(ctx, time.Minute)
	switch {
	case lostFirst && !errors.Is(err, lockkit.ErrLeaseLost):
		t.Fatalf("Extend after Lost closed = %v, want ErrLeaseLost", err)
	case lostFirst:
		t.Log("the holder learned of the takeover through Lost before it could Extend")
	case !errors.Is(err, lockkit.ErrNotHeld):
		t.Fatalf("Extend of a key another owner holds = %v, want ErrNotHeld", err)
	}
	if !backend.IsClosed(la.Lost()) {
		t.Fatal("Extend found the key taken but left Lost open")
	}
	// Nothing changed: the new holder still holds the key, for no longer
	// than its own TTL (a non-owner's extend did not lengthen it).
	if lc, err := c.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		if lc != nil {
			_ = lc.Release(ctx)
		}
		t.Fatalf("after a non-owner's Extend, TryAcquire = %v, want ErrNotAcquired", err)
	}
	wctx, cancel := context.WithTimeout(ctx, bTTL+s.crashBound())
	defer cancel()
	lc, err := c.Acquire(wctx, key, lockkit.WithTTL(s.h.TTL))
	if err != nil {
		t.Fatalf("the new holder's %v grant was not over after %v: a non-owner's Extend lengthened it (%v)", bTTL, bTTL+s.crashBound(), err)
	}
	_ = lc.Release(ctx)
}

func (s *suite) watchdog(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	a, b := s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithAutoRenew(s.h.TTL))
	time.Sleep(3*s.h.TTL + s.h.TTL/2)
	select {
	case <-la.Lost():
		t.Fatal("watchdog let the lease go while its holder lived")
	default:
	}
	if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("TryAcquire after 3 TTLs of a renewed lease = %v, want ErrNotAcquired", err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	lb := mustTry(t, b, key)
	_ = lb.Release(ctx)
}

func (s *suite) lostSignal(t *testing.T) {
	if s.h.Steal == nil {
		t.Fatal("Harness.Steal is required: every backend's grants can be deleted by an operator")
	}
	key := s.key(t)
	a := s.open(t)
	var fnErr error
	granted := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		fnErr = lockkit.Do(context.Background(), a, key, func(ctx context.Context, _ uint64) error {
			close(granted)
			<-ctx.Done()
			return context.Cause(ctx)
		}, lockkit.WithAutoRenew(s.h.TTL))
	}()
	<-granted
	s.h.Steal(t, key)
	select {
	case <-done:
		if !s.caps.LostSignal {
			t.Fatalf("backend declares no lost-lease signal, but Do was cancelled: %v", fnErr)
		}
		if !errors.Is(fnErr, lockkit.ErrLeaseLost) {
			t.Fatalf("Do's context ended with %v, want ErrLeaseLost", fnErr)
		}
	case <-time.After(s.crashBound()):
		if s.caps.LostSignal {
			t.Fatalf("lease deleted behind the holder's back, Lost not closed after %v", s.crashBound())
		}
		t.Log("absent as declared: the holder never learns its lease was taken")
	}
}

func (s *suite) fences(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	lockers := []lockkit.Locker{s.open(t), s.open(t)}
	var last uint64
	const grants = 1000
	for i := range grants {
		lease := mustAcquire(t, lockers[i%2], key, lockkit.WithTTL(10*time.Second))
		fence := lease.Fence()
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
		if !s.caps.Fencing {
			if fence != 0 {
				t.Fatalf("backend declares no fencing but grant %d has fence %d", i, fence)
			}
			continue
		}
		if fence <= last {
			t.Fatalf("grant %d has fence %d, not above the previous %d", i, fence, last)
		}
		last = fence
	}
}
