package brokenrecipes

import (
	"context"
	"crypto/rand"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const ttl = 100 * time.Millisecond

// crash stands for the process dying: whatever the recipe meant to do next
// never happens.
type crash struct{}

// A crash between SETNX and EXPIRE leaves a lock without a TTL, which no
// client gets again. The same recipe whose holder dies after EXPIRE is freed
// by its TTL: the window between the two commands is the whole flaw.
func TestSetNXExpireCrashLeavesImmortalLock(t *testing.T) {
	ctx := context.Background()
	rdb := dial(t)
	t.Run("crash-after-expire", func(t *testing.T) {
		key := testKey(t, rdb)
		holder, other := NewSetNXExpire(rdb), NewSetNXExpire(rdb)
		defer holder.Close()
		defer other.Close()
		if _, err := holder.TryAcquire(ctx, key, lockkit.WithTTL(ttl)); err != nil {
			t.Fatal(err)
		} // and the holder dies without releasing
		lease, err := other.Acquire(ctx, key, lockkit.WithTTL(ttl), lockkit.WithWaitTimeout(10*ttl))
		if err != nil {
			t.Fatalf("a dead holder's lock with a TTL was not freed: %v", err)
		}
		_ = lease.Release(ctx)
	})
	t.Run("crash-between-setnx-and-expire", func(t *testing.T) {
		key := testKey(t, rdb)
		holder, other := NewSetNXExpire(rdb), NewSetNXExpire(rdb)
		defer holder.Close()
		defer other.Close()
		holder.afterSetNX = func() { panic(crash{}) }
		crashed := func() (crashed bool) {
			defer func() {
				if r := recover(); r != nil {
					if r != (crash{}) {
						panic(r)
					}
					crashed = true
				}
			}()
			_, _ = holder.TryAcquire(ctx, key, lockkit.WithTTL(ttl))
			return false
		}()
		if !crashed {
			t.Fatal("the hook did not crash the holder")
		}

		if pttl := rdb.Do(ctx, "PTTL", key).Val(); pttl != int64(-1) {
			t.Fatalf("PTTL after the crash = %v, want -1: a key without expiry", pttl)
		}
		_, err := other.Acquire(ctx, key, lockkit.WithTTL(ttl), lockkit.WithWaitTimeout(10*ttl))
		if !errors.Is(err, lockkit.ErrNotAcquired) {
			t.Fatalf("Acquire 10 TTLs after the crash = %v, want ErrNotAcquired: the lock should never expire", err)
		}
		t.Logf("10 TTLs after the crash the key still has no expiry; it blocks everyone until deleted by hand")
	})
}

// A holder that outlived its lease releases with a plain DEL: it frees the
// lock of the next holder, B, and C takes the key while B still holds it.
// The same run over redislock, whose release checks the owner in its
// script, refuses A's release and C.
func TestPlainDelFreesAnotherHoldersLock(t *testing.T) {
	ctx := context.Background()
	rdb := dial(t)
	for _, tc := range []struct {
		name         string
		locker       func(t *testing.T) lockkit.Locker
		wantBothHold bool
	}{
		{"plain-del", func(*testing.T) lockkit.Locker { return NewPlainDel(rdb) }, true},
		{"owner-checked-delete-script", func(t *testing.T) lockkit.Locker { return safeRedisLock(t, rdb) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := testKey(t, rdb)
			a, b, c := tc.locker(t), tc.locker(t), tc.locker(t)
			defer a.Close()
			defer b.Close()
			defer c.Close()

			la, err := a.TryAcquire(ctx, key, lockkit.WithTTL(ttl))
			if err != nil {
				t.Fatal(err)
			}
			// A's critical section is slow: it runs past its lease, and B
			// takes the key once Redis has expired A's.
			<-la.Lost()
			lb, err := b.Acquire(ctx, key, lockkit.WithTTL(time.Minute), lockkit.WithWaitTimeout(100*ttl))
			if err != nil {
				t.Fatalf("B could not take the expired key: %v", err)
			}
			defer lb.Release(ctx)
			errA := la.Release(ctx)
			lc, errC := c.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
			if errC == nil {
				defer lc.Release(ctx)
			}
			select {
			case <-lb.Lost():
				t.Fatal("B's lease ended; the demonstration needs B to still hold it")
			default:
			}

			if tc.wantBothHold {
				if errA != nil {
					t.Errorf("A's release: %v; the recipe cannot even tell it failed", errA)
				}
				if errC != nil {
					t.Fatalf("C was refused (%v): the release was owner-checked after all", errC)
				}
				t.Log("B and C both hold the key: A's DEL freed B's lock")
				return
			}
			if !errors.Is(errA, lockkit.ErrNotHeld) {
				t.Errorf("A's release = %v, want ErrNotHeld: the key is B's", errA)
			}
			if !errors.Is(errC, lockkit.ErrNotAcquired) {
				t.Fatalf("C's TryAcquire = %v, want ErrNotAcquired: B holds the key", errC)
			}
		})
	}
}

// Two clients read the same stale timestamp. The first GETSET wins; the
// second loses but has replaced the winner's expiry with its own, earlier
// one, so a third client recovers the lock while the winner still holds it.
func TestGetSetTimestampLoserClobbersWinner(t *testing.T) {
	ctx := context.Background()
	rdb := dial(t)
	key := testKey(t, rdb)
	clock := fakeClock(time.Now())
	c1, c2, c3 := NewGetSetTimestamp(rdb), NewGetSetTimestamp(rdb), NewGetSetTimestamp(rdb)
	for _, c := range []*GetSetTimestamp{c1, c2, c3} {
		c.now = clock.now
		defer c.Close()
	}
	// A crashed holder's lock, long stale.
	if err := rdb.Set(ctx, key, clock.now().Add(-time.Minute).UnixMilli(), 0).Err(); err != nil {
		t.Fatal(err)
	}

	// Both contenders stop between their GET and their GETSET.
	read1, go1 := make(chan struct{}), make(chan struct{})
	read2, go2 := make(chan struct{}), make(chan struct{})
	c1.afterGet = func() { close(read1); <-go1 }
	c2.afterGet = func() { close(read2); <-go2 }
	type result struct {
		lease lockkit.Lease
		err   error
	}
	r1, r2 := make(chan result, 1), make(chan result, 1)
	go func() { l, err := c1.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute)); r1 <- result{l, err} }()
	<-read1
	go func() { l, err := c2.TryAcquire(ctx, key, lockkit.WithTTL(time.Second)); r2 <- result{l, err} }()
	<-read2

	close(go1)
	won := <-r1
	if won.err != nil {
		t.Fatalf("the first GETSET did not win: %v", won.err)
	}
	defer won.lease.Release(ctx)
	winnerExpiry := rdb.Get(ctx, key).Val()
	close(go2)
	if lost := <-r2; !errors.Is(lost.err, lockkit.ErrNotAcquired) {
		t.Fatalf("the second GETSET = %v, want ErrNotAcquired", lost.err)
	}
	if got := rdb.Get(ctx, key).Val(); got == winnerExpiry {
		t.Fatal("the loser's GETSET left the winner's expiry in place")
	}

	// Two seconds on, the stored (loser's) expiry has passed; the winner's
	// minute has not.
	clock.advance(2 * time.Second)
	l3, err := c3.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("the third client could not recover the clobbered lock: %v", err)
	}
	defer l3.Release(ctx)
	select {
	case <-won.lease.Lost():
		t.Fatal("the winner's lease ended; the demonstration needs it held")
	default:
	}
	t.Log("the winner and the third client both hold the key")
}

// Expiry is judged on each client's clock: clients whose clocks run ahead by
// more than the TTL both "recover" a lock whose holder is alive and well.
func TestGetSetTimestampSkewedClocks(t *testing.T) {
	ctx := context.Background()
	rdb := dial(t)
	key := testKey(t, rdb)
	base := time.Now()
	skewed := func(by time.Duration) *GetSetTimestamp {
		c := NewGetSetTimestamp(rdb)
		c.now = func() time.Time { return base.Add(by) }
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	holders := []lockkit.Lease{}
	defer func() {
		for _, l := range holders {
			_ = l.Release(ctx)
		}
	}()
	for _, c := range []struct {
		name string
		by   time.Duration
	}{
		{"on time", 0},
		{"20 s ahead", 20 * time.Second},
		{"40 s ahead", 40 * time.Second},
	} {
		lease, err := skewed(c.by).TryAcquire(ctx, key, lockkit.WithTTL(10*time.Second))
		if err != nil {
			t.Fatalf("client %s: %v (holders so far: %d)", c.name, err, len(holders))
		}
		holders = append(holders, lease)
	}
	for i, l := range holders {
		select {
		case <-l.Lost():
			t.Fatalf("holder %d's lease ended; the demonstration needs all three held", i)
		default:
		}
	}
	t.Log("three clients hold the key at once, each sure of its 10 s lease")
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func fakeClock(start time.Time) *clock { return &clock{t: start} }

func (c *clock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// testKey is unique per run: the crash test leaves a key that never expires
// if the run dies before its clean-up.
func testKey(t *testing.T, rdb redis.UniversalClient) string {
	key := "brokenrecipes:" + t.Name() + ":" + rand.Text()[:8]
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	return key
}

// safeRedisLock is lockkit/redislock, the safe lock the recipes are
// measured against, under a prefix of the test's own.
func safeRedisLock(t *testing.T, rdb redis.UniversalClient) lockkit.Locker {
	t.Helper()
	prefix := "brokenrecipes:" + t.Name() + ":"
	l, err := redislock.New(rdb, redislock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { deletePrefix(rdb, prefix) })
	return l
}

// deletePrefix deletes every key under prefix: a safe lock's fence counter
// outlives its lease on purpose.
func deletePrefix(rdb redis.UniversalClient, prefix string) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, prefix+"*", 100).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}

func dial(t testing.TB) redis.UniversalClient {
	t.Helper()
	rdb := redis.NewClient(&redis.Options{Addr: testenv.Require(t, "SHOP_TEST_REDIS_ADDR"), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}
