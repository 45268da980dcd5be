package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// An owner whose lease ran out, and whose key another process then took,
// must not be handed a nested lease of the dead grant by Reentrant: two
// holders at once. Reentrant asks the lease's Lost with a select and a
// default; nobody had looked at Lost before.
func TestReentrantDoesNotNestAnExpiredLease(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	ctx := context.Background()
	l := lockkit.Reentrant(newLocker(t, newClient(t, addr)))
	other := newLocker(t, newClient(t, addr))
	key := uniqueKey(t)
	alice := lockkit.WithOwner(ctx, "alice")

	outer, err := l.TryAcquire(alice, key, lockkit.WithTTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Release(ctx)
	time.Sleep(200 * time.Millisecond) // the TTL runs out
	theirs, err := other.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("key free after the TTL, yet: %v", err)
	}
	defer theirs.Release(ctx)
	nested, err := l.TryAcquire(alice, key, lockkit.WithTTL(time.Minute))
	if err == nil {
		defer nested.Release(ctx)
		t.Fatal("alice was given a nested lease of her expired grant while another process holds the key")
	}
	if !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("alice's TryAcquire of a key another holds = %v, want ErrNotAcquired", err)
	}
}
