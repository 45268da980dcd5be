package mysqllock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// Expiry is judged by the database's clock alone. Moving the row's expiry
// into the database's past frees the key at once, though no client clock
// has reached the TTL; and the row's expiry is TTL ahead of the database's
// clock, whatever the client's says.
func TestLeaseRowTimedOnDatabaseClock(t *testing.T) {
	dsn := testDSN(t)
	a, b := newLeaseLocker(t, dsn), newLeaseLocker(t, dsn)
	defer a.Close()
	defer b.Close()
	ctx, key := context.Background(), "mysqllock:"+t.Name()

	la := mustTry(t, a, key, lockkit.WithTTL(time.Minute))
	var left time.Duration
	db, sqlDB := openDB(t, dsn)
	defer sqlDB.Close()
	err := db.Raw("SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) * 1000 FROM "+leaseTable+
		" WHERE name = ?", key).Scan(&left).Error
	if err != nil {
		t.Fatal(err)
	}
	if left <= 0 || left > time.Minute {
		t.Fatalf("lease row expires %v after the database's now, want within (0, 1m]", left)
	}
	if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key = %v, want ErrNotAcquired", err)
	}

	execSQL(t, dsn, "UPDATE "+leaseTable+" SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = ?", key)
	lb := mustTry(t, b, key, lockkit.WithTTL(time.Minute))
	defer lb.Release(ctx)
	if lb.Fence() != la.Fence()+1 {
		t.Fatalf("takeover of an expired row has fence %d, want %d", lb.Fence(), la.Fence()+1)
	}
	if err := la.Extend(ctx, time.Minute); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("extend of an expired lease = %v, want ErrNotHeld", err)
	}
}

// Close ends waits at once, on both backends.
func TestCloseEndsWaits(t *testing.T) {
	dsn := testDSN(t)
	for name, open := range map[string]func(testing.TB, string) lockkit.Locker{"mysql": newLeaseLocker, "mysql-forupdate": newRowLocker} {
		t.Run(name, func(t *testing.T) {
			a, b := open(t, dsn), open(t, dsn)
			defer a.Close()
			ctx, key := context.Background(), "mysqllock:"+t.Name()
			la := mustTry(t, a, key, lockkit.WithTTL(time.Minute))
			defer la.Release(ctx)
			waited := make(chan error, 1)
			go func() {
				_, err := b.Acquire(ctx, key)
				waited <- err
			}()
			time.Sleep(50 * time.Millisecond) // let b start waiting
			_ = b.Close()
			select {
			case err := <-waited:
				if !errors.Is(err, lockkit.ErrClosed) {
					t.Fatalf("Acquire ended by Close = %v, want ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close did not end a wait")
			}
		})
	}
}
