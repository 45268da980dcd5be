package lockkit_test

import (
	"context"
	"errors"
	"testing"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
)

// DoFenced is for stores that check the fence: asked for an unfenced grant
// it refuses before taking the lock, rather than hand the store a 0 that
// it would take for a backend that cannot fence.
func TestDoFencedRefusesAnUnfencedGrant(t *testing.T) {
	l := local.New()
	defer l.Close()
	ctx := context.Background()
	ran := false
	fn := func(context.Context, uint64) error { ran = true; return nil }
	if err := lockkit.DoFenced(ctx, l, "k", fn, lockkit.WithoutFence()); !errors.Is(err, lockkit.ErrUnfenced) {
		t.Fatalf("DoFenced with WithoutFence = %v, want ErrUnfenced", err)
	}
	many := func(context.Context, map[string]uint64) error { ran = true; return nil }
	if err := lockkit.DoManyFenced(ctx, l, []string{"a", "b"}, many, lockkit.WithoutFence()); !errors.Is(err, lockkit.ErrUnfenced) {
		t.Fatalf("DoManyFenced with WithoutFence = %v, want ErrUnfenced", err)
	}
	if ran {
		t.Fatal("fn ran on an unfenced grant")
	}
	lease, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("the refusal left the key held: %v", err)
	}
	_ = lease.Release(ctx)
}
