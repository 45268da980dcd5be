package redlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend/linetest"
	"github.com/lockbench/shop/internal/lockkit/redlock"
)

// BenchmarkUncontended prices one uncontended acquire and release against
// the raw round trip to one master and against redsync used directly, so
// the table shows what the wrapper (lease keeper, error mapping) costs.
func BenchmarkUncontended(b *testing.B) {
	ctx := context.Background()
	clients := dial(b, masterAddrs(b))
	key := "redlock:bench:" + b.Name()

	b.Run("baseline=ping-one-master", func(b *testing.B) {
		for b.Loop() {
			if err := clients[0].Ping(ctx).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("peer=redsync", func(b *testing.B) {
		pools := make([]redsyncredis.Pool, len(clients))
		for i, c := range clients {
			pools[i] = goredis.NewPool(c)
		}
		rs := redsync.New(pools...)
		for b.Loop() {
			m := rs.NewMutex(key, redsync.WithExpiry(10*time.Second), redsync.WithTries(1))
			if err := m.LockContext(ctx); err != nil {
				b.Fatal(err)
			}
			if ok, err := m.UnlockContext(ctx); !ok {
				b.Fatal(err)
			}
		}
	})
	b.Run("lockkit=redlock", func(b *testing.B) {
		l := redlock.New(clients)
		defer l.Close()
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

// BenchmarkContended: see linetest.ContendedShapes.
func BenchmarkContended(b *testing.B) {
	addrs := masterAddrs(b)
	linetest.ContendedShapes(b, func(b *testing.B) lockkit.Locker { return redlock.New(dial(b, addrs)) }, "redlock:bench:")
}
