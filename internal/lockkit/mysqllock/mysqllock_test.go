package mysqllock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/lockkit/mysqllock"
	"github.com/lockbench/shop/internal/testenv"
)

// Every table this package's tests touch lives in this database, so tests
// of other packages on the same server never meet them.
const database = "shop_test_mysqllock"

const (
	leaseTable = "mysqllock_test_leases"
	rowTable   = "mysqllock_test_rowlocks"
	ttl        = 300 * time.Millisecond
)

// testDSN returns the DSN of the test database, creating it if needed.
// Without SHOP_TEST_MYSQL_DSN the test is skipped, except in CI where a
// missing server is a failure.
func testDSN(t testing.TB) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.Require(t, "SHOP_TEST_MYSQL_DSN"))
	if err != nil {
		t.Fatalf("SHOP_TEST_MYSQL_DSN: %v", err)
	}
	server, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if _, err := server.Exec("CREATE DATABASE IF NOT EXISTS " + database); err != nil {
		t.Fatalf("create test database: %v", err)
	}
	cfg.DBName = database
	return cfg.FormatDSN()
}

// openDB opens a gorm DB as the service would; the caller closes it.
func openDB(t testing.TB, dsn string) (*gorm.DB, *sql.DB) {
	t.Helper()
	db, err := gorm.Open(gormmysql.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		t.Fatal(err)
	}
	return db, sqlDB
}

// withDB closes the Locker's gorm pool with the Locker, as a process
// would on exit.
type withDB struct {
	lockkit.Locker
	db *sql.DB
}

func (w withDB) Capabilities() lockkit.Capabilities {
	return w.Locker.(lockkit.Describer).Capabilities()
}

func (w withDB) Close() error {
	err := w.Locker.Close()
	_ = w.db.Close()
	return err
}

func newLeaseLocker(t testing.TB, dsn string) lockkit.Locker {
	t.Helper()
	db, sqlDB := openDB(t, dsn)
	l, err := mysqllock.New(db, mysqllock.WithTable(leaseTable))
	if err != nil {
		t.Fatal(err)
	}
	return withDB{l, sqlDB}
}

func newRowLocker(t testing.TB, dsn string) lockkit.Locker {
	t.Helper()
	db, sqlDB := openDB(t, dsn)
	l, err := mysqllock.NewForUpdate(db, mysqllock.WithTable(rowTable))
	if err != nil {
		t.Fatal(err)
	}
	return withDB{l, sqlDB}
}

func TestConformanceLeaseRow(t *testing.T) {
	dsn := testDSN(t)
	locktest.Run(t, locktest.Harness{
		New:   func(t testing.TB) lockkit.Locker { return newLeaseLocker(t, dsn) },
		Wired: func(t testing.TB, w *locktest.Wire) lockkit.Locker { return newLeaseLocker(t, proxied(t, dsn, w)) },
		// An operator freeing the row; the holder's next renewal finds it.
		Steal: func(t testing.TB, key string) {
			execSQL(t, dsn, "UPDATE "+leaseTable+" SET owner = NULL, expires_at = NULL WHERE name = ?", key)
		},
		TTL: ttl,
	})
}

func TestConformanceForUpdate(t *testing.T) {
	dsn := testDSN(t)
	locktest.Run(t, locktest.Harness{
		New:   func(t testing.TB) lockkit.Locker { return newRowLocker(t, dsn) },
		Wired: func(t testing.TB, w *locktest.Wire) lockkit.Locker { return newRowLocker(t, proxied(t, dsn, w)) },
		Steal: func(t testing.TB, key string) { killHolder(t, dsn, key) },
		TTL:   ttl,
		// The server ends a quiet holder's session after wait_timeout,
		// which counts whole seconds: 300 ms is served as 1 s.
		CrashSlack: time.Second,
	})
}

// proxied is dsn with its server reached through w.
func proxied(t testing.TB, dsn string, w *locktest.Wire) string {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Addr = w.Proxy(cfg.Addr)
	return cfg.FormatDSN()
}

func execSQL(t testing.TB, dsn, query string, args ...any) sql.Result {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	res, err := db.Exec(query, args...)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// killHolder KILLs the session holding key's row lock, found as an operator
// would: by the label the grant puts on its session.
func killHolder(t testing.TB, dsn, key string) {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var holder sql.NullInt64
	if err := db.QueryRow("SELECT IS_USED_LOCK(SHA1(?))", []byte(key)).Scan(&holder); err != nil || !holder.Valid {
		t.Fatalf("no holder of %s to kill: %v", key, err)
	}
	if _, err := db.Exec(fmt.Sprintf("KILL %d", holder.Int64)); err != nil {
		t.Fatal(err)
	}
}

func TestUnavailableServer(t *testing.T) {
	// Port 1 on loopback refuses at once: a server that is down.
	db, err := gorm.Open(gormmysql.New(gormmysql.Config{
		DSN: "root@tcp(127.0.0.1:1)/x?timeout=1s", SkipInitializeWithVersion: true,
	}), &gorm.Config{DisableAutomaticPing: true, Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	defer sqlDB.Close()
	if _, err := mysqllock.New(db); !errors.Is(err, lockkit.ErrUnavailable) {
		t.Errorf("New on a down server = %v, want ErrUnavailable", err)
	}
	if _, err := mysqllock.NewForUpdate(db); !errors.Is(err, lockkit.ErrUnavailable) {
		t.Errorf("NewForUpdate on a down server = %v, want ErrUnavailable", err)
	}
}

func TestUnavailableAfterStart(t *testing.T) {
	dsn := testDSN(t)
	db, sqlDB := openDB(t, dsn)
	l, err := mysqllock.New(db, mysqllock.WithTable(leaseTable))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_ = sqlDB.Close() // the pool is gone, as after a lost server
	_, err = l.TryAcquire(context.Background(), "mysqllock:"+t.Name())
	if !errors.Is(err, lockkit.ErrUnavailable) {
		t.Fatalf("TryAcquire without a server = %v, want ErrUnavailable", err)
	}
}

func TestKeyTooLong(t *testing.T) {
	dsn := testDSN(t)
	for name, open := range map[string]func(testing.TB, string) lockkit.Locker{"mysql": newLeaseLocker, "mysql-forupdate": newRowLocker} {
		t.Run(name, func(t *testing.T) {
			l := open(t, dsn)
			defer l.Close()
			long := string(make([]byte, mysqllock.MaxKeyLen+1))
			if _, err := l.TryAcquire(context.Background(), long); !errors.Is(err, mysqllock.ErrKeyTooLong) {
				t.Fatalf("TryAcquire of a %d-byte key = %v, want ErrKeyTooLong", len(long), err)
			}
		})
	}
}

func TestBadTable(t *testing.T) {
	dsn := testDSN(t)
	db, sqlDB := openDB(t, dsn)
	defer sqlDB.Close()
	if _, err := mysqllock.New(db, mysqllock.WithTable("locks; DROP TABLE x")); err == nil {
		t.Fatal("New accepted a table name that is not an identifier")
	}
	// A table of the same name made for something else must be refused,
	// not found out at the first grant.
	execSQL(t, dsn, "CREATE TABLE IF NOT EXISTS mysqllock_test_other (name VARBINARY(255) PRIMARY KEY, n INT NOT NULL)")
	if _, err := mysqllock.NewForUpdate(db, mysqllock.WithTable("mysqllock_test_other")); err == nil {
		t.Fatal("NewForUpdate accepted a table with columns it does not fill")
	}
}
