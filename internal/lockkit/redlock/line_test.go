package redlock_test

import (
	"testing"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend/linetest"
	"github.com/lockbench/shop/internal/lockkit/locktest"
	"github.com/lockbench/shop/internal/lockkit/redlock"
)

func TestLine(t *testing.T) {
	addrs := masterAddrs(t)
	linetest.Run(t, linetest.Harness{
		New: func(t testing.TB) lockkit.Locker { return redlock.New(dial(t, addrs)) },
		Wired: func(t testing.TB, w *locktest.Wire) lockkit.Locker {
			proxied := make([]string, len(addrs))
			for i, a := range addrs {
				proxied[i] = w.Proxy(a)
			}
			return redlock.New(dial(t, proxied))
		},
	})
}
