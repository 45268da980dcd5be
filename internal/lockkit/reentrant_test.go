package lockkit_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
)

func TestReentrantNestsPerOwnerAndReleasesOnTheLast(t *testing.T) {
	ctx := context.Background()
	store := local.New()
	defer store.Close()
	l := lockkit.Reentrant(store)
	alice := lockkit.WithOwner(ctx, "alice")
	outer, err := l.TryAcquire(alice, "k", lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	inner, err := l.Acquire(alice, "k", lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("owner's nested Acquire: %v", err)
	}
	if inner.Fence() != outer.Fence() {
		t.Fatalf("nested fence %d, outer %d", inner.Fence(), outer.Fence())
	}
	if _, err := l.TryAcquire(lockkit.WithOwner(ctx, "bob"), "k"); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("another owner = %v, want ErrNotAcquired", err)
	}
	if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("no owner = %v, want ErrNotAcquired", err)
	}
	if err := outer.Release(ctx); err != nil { // releases nest by count, in any order
		t.Fatal(err)
	}
	if err := outer.Release(ctx); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("second release of one nested lease = %v, want ErrNotHeld", err)
	}
	if _, err := store.TryAcquire(ctx, "k"); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("key freed while a nested lease remains: %v", err)
	}
	if err := inner.Release(ctx); err != nil {
		t.Fatal(err)
	}
	free, err := store.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("key held after the last nested release: %v", err)
	}
	_ = free.Release(ctx)
}

// A hold whose lease was lost is not handed out again: the owner waits
// for a fresh grant like anyone else.
func TestReentrantDoesNotNestIntoALostLease(t *testing.T) {
	ctx := context.Background()
	store := local.New()
	defer store.Close()
	l := lockkit.Reentrant(store)
	alice := lockkit.WithOwner(ctx, "alice")
	first, err := l.TryAcquire(alice, "k", lockkit.WithTTL(30*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-first.Lost()
	second, err := l.TryAcquire(alice, "k", lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("owner's grant after its lease was lost: %v", err)
	}
	if second.Fence() <= first.Fence() {
		t.Fatalf("got the lost grant again (fence %d, first %d)", second.Fence(), first.Fence())
	}
	_ = second.Release(ctx)
	_ = first.Release(ctx)
	if _, err := store.TryAcquire(ctx, "k"); err != nil {
		t.Fatalf("key held after both releases: %v", err)
	}
}

func TestReentrantDeclaresReentrancyOverTheBackend(t *testing.T) {
	store := local.New()
	defer store.Close()
	c := lockkit.CapabilitiesOf(lockkit.Reentrant(store))
	want := store.Capabilities()
	want.Reentrant = true
	if c != want {
		t.Fatalf("capabilities %+v, want %+v", c, want)
	}
}

// A nested lease is the outer grant: Extend reaches it and Lost is its.
func TestReentrantNestedLeaseIsTheGrant(t *testing.T) {
	ctx := context.Background()
	store := local.New()
	defer store.Close()
	l := lockkit.Reentrant(store)
	alice := lockkit.WithOwner(ctx, "alice")
	outer, err := l.TryAcquire(alice, "k", lockkit.WithTTL(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	inner, err := l.TryAcquire(alice, "k")
	if err != nil {
		t.Fatal(err)
	}
	if inner.Key() != "k" || inner.Lost() != outer.Lost() {
		t.Fatal("the nested lease is not the outer grant")
	}
	start := time.Now()
	if err := inner.Extend(ctx, 300*time.Millisecond); err != nil {
		t.Fatalf("nested Extend: %v", err)
	}
	<-outer.Lost()
	if lost := time.Since(start); lost < 300*time.Millisecond {
		t.Fatalf("outer grant lost after %v: the nested Extend did not reach it", lost)
	}
	_ = inner.Release(ctx)
	_ = outer.Release(ctx)
}

// Many nestings by one owner at once are counted exactly: the key is held
// until the last of them is released, and free after.
func TestReentrantCountsConcurrentNestings(t *testing.T) {
	ctx := context.Background()
	store := local.New()
	defer store.Close()
	l := lockkit.Reentrant(store)
	alice := lockkit.WithOwner(ctx, "alice")
	outer, err := l.TryAcquire(alice, "k", lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	start := make(chan struct{})
	var wg sync.WaitGroup
	for range 20 {
		wg.Go(func() {
			<-start
			inner, err := l.Acquire(alice, "k")
			if err != nil {
				t.Error(err)
				return
			}
			if err := inner.Release(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	close(start)
	wg.Wait()
	if _, err := store.TryAcquire(ctx, "k"); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("key freed while the outer lease remains: %v", err)
	}
	if err := outer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	free, err := store.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("key held after every nesting was released: %v", err)
	}
	_ = free.Release(ctx)
}

// Holds are per owner and key: one owner's keys do not nest into each
// other, and a grant that failed leaves no hold behind.
func TestReentrantHoldsArePerOwnerAndKey(t *testing.T) {
	ctx := context.Background()
	store := local.New()
	defer store.Close()
	l := lockkit.Reentrant(store)
	alice, bob := lockkit.WithOwner(ctx, "alice"), lockkit.WithOwner(ctx, "bob")
	a1, err := l.TryAcquire(alice, "k1", lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	a2, err := l.TryAcquire(alice, "k2", lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if a1.Fence() == 0 || a2.Fence() == 0 {
		t.Fatal("a grant without a fence from a fencing backend")
	}
	if _, err := l.Acquire(bob, "k1", lockkit.WithWaitTimeout(20*time.Millisecond)); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("bob's Acquire of alice's key = %v, want ErrNotAcquired", err)
	}
	if err := a1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.TryAcquire(ctx, "k2"); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("releasing k1 freed k2: %v", err)
	}
	b1, err := l.TryAcquire(bob, "k1", lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("bob after alice released: %v", err)
	}
	if b1.Fence() <= a1.Fence() {
		t.Fatalf("bob nested into a stale hold (fence %d, alice's %d)", b1.Fence(), a1.Fence())
	}
	_ = b1.Release(ctx)
	_ = a2.Release(ctx)
}

func TestReentrantPassesUnwrapAndCloseThrough(t *testing.T) {
	store := local.New()
	l := lockkit.Reentrant(store)
	if u, ok := l.(interface{ Unwrap() lockkit.Locker }); !ok || u.Unwrap() != lockkit.Locker(store) {
		t.Fatal("Unwrap does not return the backend")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := store.TryAcquire(context.Background(), "k"); !errors.Is(err, lockkit.ErrClosed) {
		t.Fatalf("backend after the reentrant Locker's Close = %v, want ErrClosed", err)
	}
}
