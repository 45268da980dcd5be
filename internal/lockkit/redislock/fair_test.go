package redislock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

// A waiter that dies while queued must not stall the fair queue for longer
// than its waiter timeout: the next waiter passes it.
func TestFairQueueSkipsDeadWaiter(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")
	client := redis.NewClient(&redis.Options{Addr: addr[0]})
	defer client.Close()
	const waiterTimeout = 500 * time.Millisecond
	newLocker := func() *redislock.Locker {
		return redislock.New(client, redislock.WithPrefix("redislock-fair-test:"), redislock.WithWaiterTimeout(waiterTimeout))
	}
	holder, dead, alive := newLocker(), newLocker(), newLocker()
	defer holder.Close()
	defer alive.Close()
	ctx := context.Background()
	key := "dead-waiter-" + time.Now().Format("150405.000000")

	held, err := holder.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute), lockkit.WithFair())
	if err != nil {
		t.Fatal(err)
	}
	deadResult := make(chan error, 1)
	go func() {
		_, err := dead.Acquire(ctx, key, lockkit.WithFair())
		deadResult <- err
	}()
	time.Sleep(100 * time.Millisecond) // the doomed waiter is queued first
	_ = dead.Close()                   // and dies without leaving the queue
	if err := <-deadResult; !errors.Is(err, lockkit.ErrClosed) {
		t.Fatalf("dead waiter: %v", err)
	}

	got := make(chan error, 1)
	go func() {
		lease, err := alive.Acquire(ctx, key, lockkit.WithFair(), lockkit.WithWaitTimeout(10*waiterTimeout))
		if err == nil {
			_ = lease.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("live waiter behind a dead one: %v", err)
	}
}
