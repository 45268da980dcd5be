package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// An unfenced grant is a plain SET NX PX: no token, no counter written,
// and still exclusive, owner-checked, and handed on to a waiter.
func TestUnfencedGrantWritesNoCounter(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	a, b := newLocker(t, newClient(t, addr)), newLocker(t, newClient(t, addr))
	ctx := context.Background()
	key := uniqueKey(t)
	lease, err := a.Acquire(ctx, key, lockkit.WithoutFence(), lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if f := lease.Fence(); f != 0 {
		t.Fatalf("unfenced grant's Fence() = %d, want 0", f)
	}
	if n := admin.Exists(ctx, "{"+testPrefix+key+"}:fence").Val(); n != 0 {
		t.Fatal("an unfenced grant wrote the fence counter")
	}
	if _, err := b.TryAcquire(ctx, key, lockkit.WithoutFence()); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key = %v, want ErrNotAcquired", err)
	}
	waited := make(chan error, 1)
	go func() {
		l, err := b.Acquire(ctx, key, lockkit.WithoutFence(), lockkit.WithWaitTimeout(30*time.Second))
		if err == nil {
			err = l.Release(ctx)
		}
		waited <- err
	}()
	time.Sleep(50 * time.Millisecond) // let the waiter queue; it is granted either way
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("waiter after an unfenced release: %v", err)
	}
}
