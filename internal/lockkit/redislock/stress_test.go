package redislock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

// Two Lockers, random cancellations, short and
// long TTLs: never two holders at once, fences rising in grant order, and
// the key free at the end with every lease released.
func TestHandOverStressMutualExclusion(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	stressHandOver(t, []*redislock.Locker{newLocker(t, newClient(t, addr)), newLocker(t, newClient(t, addr))}, false)
}

// One Locker, and the mark cleared all the time, so that nearly every
// release hands over, while waiters give up at random.
func TestHandOverStressOneLockerMarkCleared(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	stressHandOver(t, []*redislock.Locker{newLocker(t, newClient(t, addr))}, true)
}

func stressHandOver(t *testing.T, lockers []*redislock.Locker, unmarking bool) {
	if testing.Short() && os.Getenv("CI") != "true" {
		t.Skip("stress: not with -short, except in CI, where nothing is skipped")
	}
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	key := uniqueKey(t)
	lock := "{" + testPrefix + key + "}"
	if unmarking {
		defer keepUnmarking(admin, lock)()
	}

	var s stressHolders
	deadline := time.Now().Add(8 * time.Second)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			l := lockers[g%len(lockers)]
			for time.Now().Before(deadline) {
				opts := []lockkit.Option{lockkit.WithTTL(time.Duration(200+rand.IntN(2000)) * time.Millisecond)}
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rand.IntN(30))*time.Millisecond)
				lease, err := l.Acquire(ctx, key, opts...)
				cancel()
				s.hold(t, lease, err)
			}
		})
	}
	wg.Wait()
	t.Logf("%d grants, %d cancelled waits", s.grants.Load(), s.cancels.Load())
	end := time.Now().Add(2 * time.Second)
	for admin.Exists(context.Background(), lock).Val() != 0 {
		if time.Now().After(end) {
			t.Fatalf("key held by %q (pttl %v) with every lease released",
				admin.Get(context.Background(), lock).Val(), admin.PTTL(context.Background(), lock).Val())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// keepUnmarking clears the lock's mark every 500 µs until the returned
// stop is called.
func keepUnmarking(admin *redis.Client, lock string) (stop func()) {
	done := make(chan struct{})
	var clearing sync.WaitGroup
	clearing.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(500 * time.Microsecond):
				clearMark(context.Background(), admin, lock)
			}
		}
	})
	return func() { close(done); clearing.Wait() }
}

// stressHolders checks the grants of a stress run: one holder at a time,
// tokens rising.
type stressHolders struct {
	inside          atomic.Int32
	mu              sync.Mutex
	lastFence       uint64
	grants, cancels atomic.Int64
}

// hold checks an Acquire's outcome, holds the lease a moment and releases it.
func (s *stressHolders) hold(t *testing.T, lease lockkit.Lease, err error) {
	if err != nil {
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
			t.Errorf("acquire: %v", err)
		}
		s.cancels.Add(1)
		return
	}
	if n := s.inside.Add(1); n != 1 {
		t.Errorf("%d holders at once", n)
	}
	s.mu.Lock()
	if f := lease.Fence(); f <= s.lastFence {
		t.Errorf("fence %d after %d", f, s.lastFence)
	} else {
		s.lastFence = f
	}
	s.mu.Unlock()
	s.grants.Add(1)
	time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond)
	s.inside.Add(-1)
	if err := lease.Release(context.Background()); err != nil {
		t.Errorf("release: %v", err)
	}
}
