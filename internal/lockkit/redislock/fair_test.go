package redislock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

// A waiter that dies while queued must not stall the queue for longer
// than its waiter timeout: the next waiter passes it.
func TestFairQueueSkipsDeadWaiter(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")
	client := redis.NewClient(&redis.Options{Addr: addr[0], ContextTimeoutEnabled: true})
	defer client.Close()
	const waiterTimeout = 500 * time.Millisecond
	newLocker := func() *redislock.Locker {
		l, err := redislock.New(client, redislock.WithPrefix("redislock-fair-test:"), redislock.WithWaiterTimeout(waiterTimeout))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	holder, dead, alive := newLocker(), newLocker(), newLocker()
	defer holder.Close()
	defer alive.Close()
	ctx := context.Background()
	key := "dead-waiter-" + time.Now().Format("150405.000000")

	held, err := holder.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	deadResult := make(chan error, 1)
	go func() {
		_, err := dead.Acquire(ctx, key)
		deadResult <- err
	}()
	time.Sleep(100 * time.Millisecond) // the doomed waiter is queued first
	_ = dead.Close()                   // and dies without leaving the queue
	if err := <-deadResult; !errors.Is(err, lockkit.ErrClosed) {
		t.Fatalf("dead waiter: %v", err)
	}

	got := make(chan error, 1)
	go func() {
		lease, err := alive.Acquire(ctx, key, lockkit.WithWaitTimeout(10*waiterTimeout))
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

// callCounter counts the commands a client sends.
type callCounter struct{ n atomic.Int64 }

func (c *callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}
func (c *callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// A free key whose queue is headed by a crashed waiter is passed on
// when that waiter's place expires; the live waiter behind it sleeps until
// then instead of asking Redis every millisecond.
func TestFairWaiterBehindDeadHeadDoesNotPoll(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	const waiterTimeout = 600 * time.Millisecond
	admin := newClient(t, addr)
	holder := newLocker(t, admin, redislock.WithWaiterTimeout(waiterTimeout))
	waiterClient := newClient(t, addr)
	calls := &callCounter{}
	waiterClient.AddHook(calls)
	alive := newLocker(t, waiterClient, redislock.WithWaiterTimeout(waiterTimeout))
	ctx := context.Background()
	key := uniqueKey(t)

	held := hold(t, holder, key)
	// A waiter that crashed while queued: its place stays until its deadline.
	now, err := admin.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	base := "{" + testPrefix + key + "}"
	admin.RPush(ctx, base+":queue", "crashed-waiter")
	admin.ZAdd(ctx, base+":waiters", redis.Z{Score: float64(now.Add(waiterTimeout).UnixMilli()), Member: "crashed-waiter"})

	waiter := acquireAsync(alive, ctx, key, lockkit.WithWaitTimeout(10*waiterTimeout))
	time.Sleep(50 * time.Millisecond)
	before := calls.n.Load()
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-waiter
	if got.err != nil {
		t.Fatalf("live waiter behind a crashed one: %v", got.err)
	}
	if n := calls.n.Load() - before; n > 10 {
		t.Errorf("the live waiter sent %d commands while the crashed waiter's place ran out (%v)", n, waiterTimeout)
	}
	_ = got.lease.Release(ctx)
}

// A waiter whose Locker closes leaves the queue at once: it does not
// hold up the next waiter for a waiter timeout.
func TestCloseLeavesFairQueue(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	holder := newLocker(t, admin)
	l, err := redislock.New(newClient(t, addr), redislock.WithPrefix(testPrefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	key := uniqueKey(t)

	held := hold(t, holder, key)
	defer held.Release(ctx)
	waiter := acquireAsync(l, ctx, key)
	time.Sleep(100 * time.Millisecond)
	_ = l.Close()
	if got := <-waiter; !errors.Is(got.err, lockkit.ErrClosed) {
		t.Fatalf("waiter of a closed Locker: %v", got.err)
	}
	queue := admin.LRange(ctx, "{"+testPrefix+key+"}:queue", 0, -1).Val()
	if len(queue) != 0 {
		t.Errorf("queue after Close: %v, want empty", queue)
	}
}

// Fair means granted in arrival order, across Lockers (processes) that
// each have several waiters: every waiter queues in Redis.
func TestFairOrderAcrossLockers(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	holder := newLocker(t, newClient(t, addr))
	a, b := newLocker(t, newClient(t, addr)), newLocker(t, newClient(t, addr))
	ctx := context.Background()
	key := uniqueKey(t)
	queue := "{" + testPrefix + key + "}:queue"

	held := hold(t, holder, key)
	arrivals := []struct {
		name string
		l    *redislock.Locker
	}{{"a1", a}, {"a2", a}, {"b1", b}, {"b2", b}, {"a3", a}, {"b3", b}}
	order := make(chan string, len(arrivals))
	var wg sync.WaitGroup
	for i, w := range arrivals {
		wg.Go(func() {
			lease, err := w.l.Acquire(ctx, key, lockkit.WithTTL(time.Minute), lockkit.WithWaitTimeout(20*time.Second))
			if err != nil {
				t.Errorf("%s: %v", w.name, err)
				return
			}
			order <- w.name
			_ = lease.Release(ctx)
		})
		// Arrival is the waiter's place in Redis: w is queued before the
		// next arrives, however long its first calls take (a Locker's
		// first dials a connection).
		waitFor(t, 5*time.Second, w.name+" queued", func() bool {
			return admin.LLen(ctx, queue).Val() == int64(i+1)
		})
	}
	_ = held.Release(ctx)
	wg.Wait()
	close(order)
	var got, want []string
	for name := range order {
		got = append(got, name)
	}
	for _, w := range arrivals {
		want = append(want, w.name)
	}
	if !slices.Equal(got, want) {
		t.Errorf("grant order %v, arrival order %v", got, want)
	}
}
