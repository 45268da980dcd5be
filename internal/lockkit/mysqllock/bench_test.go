package mysqllock_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend/linetest"
)

// BenchmarkRawRoundTrip is the baseline the lock benchmarks are read
// against: one SELECT 1 on the same server through the same kind of pool.
func BenchmarkRawRoundTrip(b *testing.B) {
	_, sqlDB := openDB(b, testDSN(b))
	defer sqlDB.Close()
	ctx := context.Background()
	for b.Loop() {
		var one int
		if err := sqlDB.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRawWrite is the second baseline: one autocommitted single-row
// UPDATE, whose cost is mostly the server's durable commit (a log flush
// with innodb_flush_log_at_trx_commit=1). Every grant and release writes,
// so this, not SELECT 1, is the floor a database lock stands on.
func BenchmarkRawWrite(b *testing.B) {
	dsn := testDSN(b)
	execSQL(b, dsn, "CREATE TABLE IF NOT EXISTS mysqllock_test_bench (id INT PRIMARY KEY, n BIGINT NOT NULL)")
	execSQL(b, dsn, "INSERT IGNORE INTO mysqllock_test_bench VALUES (1, 0)")
	_, sqlDB := openDB(b, dsn)
	defer sqlDB.Close()
	stmt, err := sqlDB.Prepare("UPDATE mysqllock_test_bench SET n = n + 1 WHERE id = 1")
	if err != nil {
		b.Fatal(err)
	}
	defer stmt.Close()
	ctx := context.Background()
	for b.Loop() {
		if _, err := stmt.ExecContext(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkUncontended is one acquire and one release of a free key: what
// a lock adds to every request that does not meet another. Divide by
// BenchmarkRawRoundTrip for the cost in round trips, by BenchmarkRawWrite
// for the cost in commits (mysql: two; mysql-forupdate: one, plus its
// longer statements).
func BenchmarkUncontended(b *testing.B) {
	dsn := testDSN(b)
	for name, open := range map[string]func(testing.TB, string) lockkit.Locker{"mysql": newLeaseLocker, "mysql-forupdate": newRowLocker} {
		b.Run(name, func(b *testing.B) {
			l := open(b, dsn)
			defer l.Close()
			ctx, key := context.Background(), "mysqllock:"+b.Name()
			for b.Loop() {
				lease, err := l.Acquire(ctx, key, lockkit.WithTTL(10*time.Second))
				if err != nil {
					b.Fatal(err)
				}
				if err := lease.Release(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkContended: see linetest.ContendedShapes.
func BenchmarkContended(b *testing.B) {
	dsn := testDSN(b)
	linetest.ContendedShapes(b, func(b *testing.B) lockkit.Locker { return newLeaseLocker(b, dsn) }, "mysqllock:bench:")
}
