package brokenrecipes

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	_ "github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/mysqllock"
	"github.com/lockbench/shop/internal/shoptest"
)

// A holder takes the key and dies without unlocking. With the unique-row
// table nobody gets the key again: 10 TTLs later it is still locked, its
// row still there. The lease row of lockkit/mysqllock, in the same run,
// frees it when the lease's expiry passes.
func TestUniqueRowDeadHolderLocksForever(t *testing.T) {
	ctx := context.Background()
	dsn := shoptest.MySQL(t)
	for _, tc := range []struct {
		name string
		// open returns a Locker on a pool of its own, as a process has,
		// and a func that kills that process: the pool closes, nothing is
		// released.
		open         func(t *testing.T) (l lockkit.Locker, die func())
		wantFreed    bool
		wantRowAfter int
	}{{
		name: "unique-row",
		open: func(t *testing.T) (lockkit.Locker, func()) {
			db := openSQL(t, dsn)
			l, err := NewUniqueRow(ctx, db)
			if err != nil {
				t.Fatal(err)
			}
			return l, func() { _ = l.Close(); _ = db.Close() }
		},
		wantRowAfter: 1,
	}, {
		name: "lease-row",
		open: func(t *testing.T) (lockkit.Locker, func()) {
			db := openGorm(t, dsn)
			l, err := mysqllock.New(db)
			if err != nil {
				t.Fatal(err)
			}
			sqlDB, _ := db.DB()
			return l, func() { _ = l.Close(); _ = sqlDB.Close() }
		},
		wantFreed: true,
	}} {
		t.Run(tc.name, func(t *testing.T) {
			key := "brokenrecipes:" + t.Name()
			holder, die := tc.open(t)
			if _, err := holder.TryAcquire(ctx, key, lockkit.WithTTL(ttl)); err != nil {
				t.Fatal(err)
			}
			die()

			other, _ := tc.open(t)
			defer other.Close()
			lease, err := other.Acquire(ctx, key, lockkit.WithTTL(ttl), lockkit.WithWaitTimeout(10*ttl))
			if tc.wantFreed {
				if err != nil {
					t.Fatalf("the dead holder's lease row was not taken over after its TTL: %v", err)
				}
				_ = lease.Release(ctx)
				return
			}
			if !errors.Is(err, lockkit.ErrNotAcquired) {
				t.Fatalf("Acquire 10 TTLs after the holder died = %v, want ErrNotAcquired: the row never expires", err)
			}
			var rows int
			if err := openSQL(t, dsn).QueryRowContext(ctx, "SELECT COUNT(*) FROM brokenrecipes_locks WHERE name = ?", key).Scan(&rows); err != nil {
				t.Fatal(err)
			}
			if rows != tc.wantRowAfter {
				t.Fatalf("%d lock rows for the key, want the dead holder's %d", rows, tc.wantRowAfter)
			}
			t.Log("10 TTLs after its holder died the key is still locked; it stays so until its row is deleted by hand")
		})
	}
}

func openSQL(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func openGorm(t *testing.T, dsn string) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(gormmysql.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return db
}
