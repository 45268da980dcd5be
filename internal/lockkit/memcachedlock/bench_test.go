package memcachedlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend/linetest"
	"github.com/lockbench/shop/internal/lockkit/memcachedlock"
)

// BenchmarkUncontended prices one uncontended acquire and release (add,
// then gets and cas: three round trips) against one raw round trip.
func BenchmarkUncontended(b *testing.B) {
	ctx := context.Background()
	mc := dial(b, serverAddr(b))
	key := "memcachedlock:bench:" + b.Name()

	b.Run("baseline=get-missing-key", func(b *testing.B) {
		for b.Loop() {
			if _, err := mc.Get(key + ":missing"); !errors.Is(err, memcache.ErrCacheMiss) {
				b.Fatal(err)
			}
		}
	})
	b.Run("lockkit=memcached", func(b *testing.B) {
		l := memcachedlock.New(mc)
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
	addr := serverAddr(b)
	linetest.ContendedShapes(b, func(b *testing.B) lockkit.Locker { return memcachedlock.New(dial(b, addr)) }, "memcachedlock:bench:")
}
