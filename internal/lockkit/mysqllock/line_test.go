package mysqllock_test

import (
	"testing"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend/linetest"
	"github.com/lockbench/shop/internal/lockkit/locktest"
)

// The lease row's waiters stand in a backend.Line.
func TestLeaseRowLine(t *testing.T) {
	dsn := testDSN(t)
	linetest.Run(t, linetest.Harness{
		New:   func(t testing.TB) lockkit.Locker { return newLeaseLocker(t, dsn) },
		Wired: func(t testing.TB, w *locktest.Wire) lockkit.Locker { return newLeaseLocker(t, proxied(t, dsn, w)) },
	})
}
