package storage_test

import (
	"context"
	"testing"
	"time"

	driver "github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"

	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
)

// A DSN that does not bound reads gets DefaultReadTimeout: without one, a
// COMMIT whose reply never comes (a dropped connection the kernel does not
// notice) blocks its request for ever, and with it the lock the request
// holds, renewed by its watchdog.
func TestReadsAreBoundedByDefault(t *testing.T) {
	db, err := storage.Open(context.Background(), storage.Options{MySQLDSN: shoptest.MySQL(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	got := db.Dialector.(*gormmysql.Dialector).DSNConfig.ReadTimeout
	if got != storage.DefaultReadTimeout {
		t.Fatalf("readTimeout = %v, want %v", got, storage.DefaultReadTimeout)
	}

	cfg, _ := driver.ParseDSN(shoptest.MySQL(t))
	cfg.ReadTimeout = 7 * time.Second
	mine, err := storage.Open(context.Background(), storage.Options{MySQLDSN: cfg.FormatDSN()})
	if err != nil {
		t.Fatal(err)
	}
	defer mine.Close()
	if got := mine.Dialector.(*gormmysql.Dialector).DSNConfig.ReadTimeout; got != 7*time.Second {
		t.Fatalf("the DSN's own readTimeout became %v", got)
	}
}

// The bound ends a COMMIT whose reply is lost, with the driver's
// ErrInvalidConn (answered 503 outcome-unknown: the commit may have landed).
func TestCommitWithoutReplyEnds(t *testing.T) {
	cfg, err := driver.ParseDSN(shoptest.MySQL(t))
	if err != nil {
		t.Fatal(err)
	}
	wire := locktest.NewWire(t)
	cfg.Addr = wire.Proxy(cfg.Addr)
	cfg.ReadTimeout = time.Second
	db, err := storage.Open(context.Background(), storage.Options{MySQLDSN: cfg.FormatDSN()})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Exec("CREATE TABLE t (id INT PRIMARY KEY)").Error; err != nil {
		t.Fatal(err)
	}
	tx := db.Begin()
	if err := tx.Exec("INSERT INTO t VALUES (1)").Error; err != nil {
		t.Fatal(err)
	}
	wire.HoldReplies()
	done := make(chan error, 1)
	go func() { done <- tx.Commit().Error }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("COMMIT without a reply succeeded")
		}
		t.Logf("COMMIT without a reply: %v", err)
	case <-time.After(30 * time.Second):
		wire.Heal()
		t.Fatal("COMMIT without a reply still blocked after 30 s")
	}
	wire.Heal()
}
