package brokenrecipes

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// A holds the key and starts its release while the key is still its own.
// It pauses after the owner check; meanwhile its key expires and B takes
// it. When A goes on, the two-command release DELs B's lock and C takes
// the key while B holds it. The same run with the owner check and the
// delete in one script (redislock's release) leaves B the only holder: the
// pause can only come before the script, and the script finds B's token.
func TestGetCompareDelReleaseFreesTheNextHoldersLock(t *testing.T) {
	ctx := context.Background()
	rdb := dial(t)
	for _, tc := range []struct {
		name   string
		locker func(t *testing.T) lockkit.Locker
		// releasePaused releases lease and runs pause at the release's
		// weakest point: after the owner check, before the delete.
		releasePaused func(l lockkit.Locker, lease lockkit.Lease, pause func()) error
		wantBothHold  bool
	}{{
		name:   "get-compare-del",
		locker: func(*testing.T) lockkit.Locker { return NewGetCompareDel(rdb) },
		releasePaused: func(l lockkit.Locker, lease lockkit.Lease, pause func()) error {
			l.(*GetCompareDel).afterCompare = pause
			return lease.Release(ctx)
		},
		wantBothHold: true,
	}, {
		name:   "owner-checked-delete-script",
		locker: func(t *testing.T) lockkit.Locker { return safeRedisLock(t, rdb) },
		releasePaused: func(_ lockkit.Locker, lease lockkit.Lease, pause func()) error {
			pause()
			return lease.Release(ctx)
		},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			key := testKey(t, rdb)
			a, b, c := tc.locker(t), tc.locker(t), tc.locker(t)
			defer a.Close()
			defer b.Close()
			defer c.Close()
			la, err := a.TryAcquire(ctx, key, lockkit.WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			var lb lockkit.Lease
			errA := tc.releasePaused(a, la, func() {
				// A is paused until its key has expired and B holds it.
				lb, err = b.Acquire(ctx, key, lockkit.WithTTL(time.Minute), lockkit.WithWaitTimeout(100*ttl))
				if err != nil {
					t.Fatalf("B could not take the key A's pause let expire: %v", err)
				}
			})
			defer lb.Release(ctx)
			lc, errC := c.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
			if errC == nil {
				defer lc.Release(ctx)
			}
			select {
			case <-lb.Lost():
				t.Fatal("B's lease ended; the demonstration needs B to still hold it")
			default:
			}

			if tc.wantBothHold {
				if errA != nil {
					t.Errorf("A's release: %v; the recipe should not even notice", errA)
				}
				if errC != nil {
					t.Fatalf("C was refused (%v): A's DEL did not free B's lock", errC)
				}
				t.Log("B and C both hold the key: A's DEL, checked before its pause, freed B's lock")
				return
			}
			if !errors.Is(errA, lockkit.ErrNotHeld) {
				t.Errorf("A's release = %v, want ErrNotHeld: the key is B's", errA)
			}
			if !errors.Is(errC, lockkit.ErrNotAcquired) {
				t.Fatalf("C's TryAcquire = %v, want ErrNotAcquired: B holds the key", errC)
			}
		})
	}
}
