package lockkit_test

import (
	"context"
	"errors"
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
