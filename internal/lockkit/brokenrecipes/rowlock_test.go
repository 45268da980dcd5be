package brokenrecipes

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/lockbench/shop/internal/shoptest"
)

// mysqlLockWaitTimeout is ER_LOCK_WAIT_TIMEOUT.
const mysqlLockWaitTimeout = 1205

// A row held with SELECT … FOR UPDATE stops writers, not readers. While a
// holder has it, a plain SELECT elsewhere answers at once and an UPDATE
// waits until innodb_lock_wait_timeout refuses it. So a read-modify-write
// whose read is a plain SELECT is not serialized by the holder's lock: it
// reads the balance the holder is about to change, and its write, which
// waits for the holder's commit, then overwrites the holder's change. The
// same read-modify-write reading with FOR UPDATE waits for the holder, reads
// its result, and loses nothing.
func TestRowLockStopsWritersButNotPlainReaders(t *testing.T) {
	ctx := context.Background()
	db := openSQL(t, shoptest.MySQL(t))
	if _, err := db.ExecContext(ctx, "CREATE TABLE balances (id INT PRIMARY KEY, cents BIGINT NOT NULL) ENGINE = InnoDB"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name      string
		read      string
		wantRead  int64 // what the second read-modify-write reads
		wantFinal int64 // after 100 - 30 (the holder) and - 50 (the other)
	}{
		{"plain-select", "SELECT cents FROM balances WHERE id = 1", 100, 50},
		{"select-for-update", "SELECT cents FROM balances WHERE id = 1 FOR UPDATE", 70, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := db.ExecContext(ctx, "REPLACE INTO balances VALUES (1, 100)"); err != nil {
				t.Fatal(err)
			}
			holder, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer holder.Rollback()
			var held int64
			if err := holder.QueryRowContext(ctx, "SELECT cents FROM balances WHERE id = 1 FOR UPDATE").Scan(&held); err != nil {
				t.Fatal(err)
			}
			refusedWhileHeld(t, db)

			other, err := db.BeginTx(ctx, nil)
			if err != nil {
				t.Fatal(err)
			}
			defer other.Rollback()
			var thread int64
			if err := other.QueryRowContext(ctx, "SELECT CONNECTION_ID()").Scan(&thread); err != nil {
				t.Fatal(err)
			}
			type read struct {
				cents int64
				err   error
			}
			done := make(chan read, 1)
			go func() {
				var r read
				r.err = other.QueryRowContext(ctx, tc.read).Scan(&r.cents)
				done <- r
			}()
			// The holder commits only once the other read has either
			// answered or been seen waiting on the row: no sleep decides
			// which came first.
			var got read
			answered := false
			for deadline := time.Now().Add(30 * time.Second); !answered; {
				select {
				case got = <-done:
					answered = true
					continue
				default:
				}
				if waiting(t, db, thread) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the other read neither answered nor waited on the row")
				}
				time.Sleep(2 * time.Millisecond)
			}
			if _, err := holder.ExecContext(ctx, "UPDATE balances SET cents = ? WHERE id = 1", held-30); err != nil {
				t.Fatal(err)
			}
			if err := holder.Commit(); err != nil {
				t.Fatal(err)
			}
			if !answered {
				got = <-done
			}
			if got.err != nil {
				t.Fatal(got.err)
			}
			if got.cents != tc.wantRead {
				t.Errorf("the other read-modify-write read %d cents, want %d", got.cents, tc.wantRead)
			}
			if _, err := other.ExecContext(ctx, "UPDATE balances SET cents = ? WHERE id = 1", got.cents-50); err != nil {
				t.Fatal(err)
			}
			if err := other.Commit(); err != nil {
				t.Fatal(err)
			}
			var final int64
			if err := db.QueryRowContext(ctx, "SELECT cents FROM balances WHERE id = 1").Scan(&final); err != nil {
				t.Fatal(err)
			}
			if final != tc.wantFinal {
				t.Fatalf("final balance %d, want %d", final, tc.wantFinal)
			}
			t.Logf("read %d while the row was held; final balance %d", got.cents, final)
		})
	}
}

// refusedWhileHeld checks, while a holder has row 1 FOR UPDATE, that a
// plain SELECT answers and an UPDATE is refused when its wait runs out.
func refusedWhileHeld(t *testing.T, db *sql.DB) {
	t.Helper()
	ctx := context.Background()
	var cents int64
	if err := db.QueryRowContext(ctx, "SELECT cents FROM balances WHERE id = 1").Scan(&cents); err != nil {
		t.Fatalf("a plain SELECT of the held row: %v", err)
	}
	conn, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = 1"); err != nil {
		t.Fatal(err)
	}
	// The connection goes back to the pool: a later waiter on it must wait
	// as long as the server's default says.
	defer conn.ExecContext(ctx, "SET SESSION innodb_lock_wait_timeout = DEFAULT")
	_, err = conn.ExecContext(ctx, "UPDATE balances SET cents = cents + 1 WHERE id = 1")
	var myErr *mysql.MySQLError
	if !errors.As(err, &myErr) || myErr.Number != mysqlLockWaitTimeout {
		t.Fatalf("an UPDATE of the held row = %v, want error %d (lock wait timeout)", err, mysqlLockWaitTimeout)
	}
}

// waiting reports whether the connection thread waits on a row lock.
func waiting(t *testing.T, db *sql.DB, thread int64) bool {
	t.Helper()
	var n int
	err := db.QueryRow("SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ? AND trx_state = 'LOCK WAIT'", thread).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n > 0
}
