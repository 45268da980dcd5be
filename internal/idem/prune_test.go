package idem

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
)

// recordDBs are the databases records are kept in: SQLite, and MariaDB
// from SHOP_TEST_MYSQL_DSN (required in CI).
func recordDBs(t *testing.T) map[string]func(t *testing.T) *storage.DB {
	open := func(t *testing.T, o storage.Options) *storage.DB {
		ctx := context.Background()
		db, err := storage.Open(ctx, o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { db.Close() })
		if err := db.Migrate(ctx, Models()...); err != nil {
			t.Fatal(err)
		}
		return db
	}
	return map[string]func(t *testing.T) *storage.DB{
		"sqlite": func(t *testing.T) *storage.DB {
			return open(t, storage.Options{SQLitePath: t.TempDir() + "/idem.db"})
		},
		"mariadb": func(t *testing.T) *storage.DB { return open(t, storage.Options{MySQLDSN: shoptest.MySQL(t)}) },
	}
}

// insertRecords inserts n records of user created at createdAt.
func insertRecords(t *testing.T, db *storage.DB, user int64, n int, createdAt time.Time) {
	t.Helper()
	rows := make([]keyed.Record, n)
	for i := range rows {
		rows[i] = keyed.Record{UserID: user, KeyHash: shoptest.Random(16), Fingerprint: "fp", Status: 201,
			Header: "{}", Body: "{}", CreatedAt: createdAt}
	}
	if err := db.CreateInBatches(rows, 200).Error; err != nil {
		t.Fatal(err)
	}
}

func countRecords(t *testing.T, db *storage.DB, user int64) int64 {
	t.Helper()
	var n int64
	if err := db.Model(&keyed.Record{}).Where("user_id = ?", user).Count(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPruneDeletesExpiredRecordsAndKeepsLiveOnes: records older than the
// TTL go, in more than one batch, and are counted; a record within its
// TTL stays, so that its retry still replays.
func TestPruneDeletesExpiredRecordsAndKeepsLiveOnes(t *testing.T) {
	const ttl = time.Hour
	for name, openDB := range recordDBs(t) {
		t.Run(name, func(t *testing.T) {
			db := openDB(t)
			const expired, live = 1, 2
			insertRecords(t, db, expired, 2*pruneBatch+1, time.Now().Add(-ttl-time.Minute))
			insertRecords(t, db, live, 1, time.Now().Add(-ttl+time.Minute))
			m := &Idem{o: Options{TTL: ttl, DB: db.DB}, pruned: newPrunedCounter()}
			n, err := m.Prune(context.Background())
			if err != nil || n != 2*pruneBatch+1 {
				t.Fatalf("pruned %d (%v), want %d", n, err, 2*pruneBatch+1)
			}
			if got := countRecords(t, db, expired); got != 0 {
				t.Errorf("%d expired records left, want 0", got)
			}
			if got := countRecords(t, db, live); got != 1 {
				t.Errorf("%d live records, want 1", got)
			}
			if got := testutil.ToFloat64(m.pruned); got != 2*pruneBatch+1 {
				t.Errorf("shop_idem_records_pruned_total %v, want %d", got, 2*pruneBatch+1)
			}
		})
	}
}

// TestThePrunerLeaderPrunesAndStopsWithItsContext: RunPruner, holding the
// leader lease, runs a round at once, and returns when its context ends.
func TestThePrunerLeaderPrunesAndStopsWithItsContext(t *testing.T) {
	db := recordDBs(t)["sqlite"](t)
	const ttl = time.Hour
	insertRecords(t, db, 1, 3, time.Now().Add(-2*ttl))
	m := &Idem{o: Options{TTL: ttl, DB: db.DB}, pruned: newPrunedCounter()}
	locker := local.New()
	defer locker.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.RunPruner(ctx, locker, time.Minute, slog.New(slog.DiscardHandler))
	}()
	for testutil.ToFloat64(m.pruned) < 3 {
		select {
		case <-done:
			t.Fatal("RunPruner returned before its context ended")
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	<-done
	if got := countRecords(t, db, 1); got != 0 {
		t.Errorf("%d expired records left, want 0", got)
	}
}

// TestResetDeletesEveryRecord: an admin reset empties the tables whose
// changes the records prove, so it deletes the records too, live or not.
func TestResetDeletesEveryRecord(t *testing.T) {
	for name, openDB := range recordDBs(t) {
		t.Run(name, func(t *testing.T) {
			db := openDB(t)
			insertRecords(t, db, 1, 2, time.Now())
			m := &Idem{o: Options{TTL: time.Hour, DB: db.DB}, pruned: newPrunedCounter()}
			if err := m.Reset(context.Background(), "default"); err != nil {
				t.Fatal(err)
			}
			if got := countRecords(t, db, 1); got != 0 {
				t.Errorf("%d records after the reset, want 0", got)
			}
		})
	}
}
