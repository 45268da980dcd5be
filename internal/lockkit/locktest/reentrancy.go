package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

func (s *suite) reentrancy(t *testing.T) {
	t.Run("Declared", s.declaredReentrancy)
	t.Run("Wrapped", s.wrappedReentrancy)
}

// declaredReentrancy holds the bare Locker to its Capabilities.Reentrant.
func (s *suite) declaredReentrancy(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	l, other := s.open(t), s.open(t)
	alice := lockkit.WithOwner(ctx, "alice")
	outer := mustTry(t, l, key, lockkit.WithTTL(30*time.Second), withCtx(alice))
	inner, err := l.TryAcquire(alice, key, lockkit.WithTTL(30*time.Second))
	if !s.caps.Reentrant {
		if err == nil {
			_ = inner.Release(ctx)
			t.Fatal("backend declares no reentrancy, but granted a key its owner holds")
		}
		if !errors.Is(err, lockkit.ErrNotAcquired) {
			t.Fatalf("owner's second TryAcquire = %v, want ErrNotAcquired", err)
		}
		_ = outer.Release(ctx)
		return
	}
	if err != nil {
		t.Fatalf("backend declares reentrancy, but its owner's second TryAcquire = %v", err)
	}
	if err := inner.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("after the inner release the key must still be held; TryAcquire = %v", err)
	}
	if err := outer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lo := mustTry(t, other, key)
	_ = lo.Release(ctx)
}

// wrappedReentrancy proves lockkit.Reentrant over the backend.
func (s *suite) wrappedReentrancy(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	l := lockkit.Reentrant(s.open(t))
	other := s.open(t)
	alice := lockkit.WithOwner(ctx, "alice")
	outer := mustTry(t, l, key, lockkit.WithTTL(30*time.Second))
	_ = outer.Release(ctx) // without an owner there is no nesting: plain grant
	outer = mustAcquire(t, l, key, lockkit.WithTTL(30*time.Second), withCtx(alice))
	inner := mustAcquire(t, l, key, lockkit.WithTTL(30*time.Second), withCtx(alice))
	if inner.Fence() != outer.Fence() {
		t.Fatalf("nested grant has fence %d, the outer %d: a nested grant is the same grant", inner.Fence(), outer.Fence())
	}
	if _, err := l.TryAcquire(lockkit.WithOwner(ctx, "bob"), key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("another owner's TryAcquire = %v, want ErrNotAcquired", err)
	}
	if err := inner.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("after the inner release the key must still be held; TryAcquire = %v", err)
	}
	if err := outer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lo := mustTry(t, other, key)
	_ = lo.Release(ctx)
}
