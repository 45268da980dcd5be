package memcachedlock_test

import (
	"testing"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend/linetest"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/lockkit/memcachedlock"
)

func TestLine(t *testing.T) {
	addr := serverAddr(t)
	linetest.Run(t, linetest.Harness{
		New: func(t testing.TB) lockkit.Locker { return memcachedlock.New(dial(t, addr)) },
		Wired: func(t testing.TB, w *locktest.Wire) lockkit.Locker {
			return memcachedlock.New(dial(t, w.Proxy(addr)))
		},
	})
}
