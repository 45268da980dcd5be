package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// A release nobody waits for sends no message: the PUBLISH would be a
// third command on every uncontended cycle (and, on a Cluster, a message
// to every node). The first message seen on the channel must therefore
// be the one this test sends after the cycles.
func TestReleaseWithoutWaitersSendsNoMessage(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	l := newLocker(t, newClient(t, addr))
	ctx := context.Background()
	for _, fair := range []bool{false, true} {
		var opts []lockkit.Option
		if fair {
			opts = append(opts, lockkit.WithFair())
		}
		key := uniqueKey(t)
		channel := "{" + testPrefix + key + "}:released"
		sub := admin.Subscribe(ctx, channel)
		if _, err := sub.Receive(ctx); err != nil { // the confirmation
			t.Fatal(err)
		}
		for range 3 {
			_ = hold(t, l, key, opts...).Release(ctx)
			lease, err := l.TryAcquire(ctx, key, opts...)
			if err != nil {
				t.Fatal(err)
			}
			// A refused TryAcquire does not wait: no message is due either.
			if _, err := l.TryAcquire(ctx, key, opts...); err == nil {
				t.Fatal("TryAcquire of a held key succeeded")
			}
			_ = lease.Release(ctx)
		}
		admin.Publish(ctx, channel, "end")
		msg, err := sub.ReceiveMessage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if msg.Payload != "end" {
			t.Errorf("fair=%v: a release nobody waited for sent %q", fair, msg.Payload)
		}
		_ = sub.Close()
	}
}

// A waiter of another process is woken by the release message, not by
// the holder's lease running out: its refused attempt asked for one.
func TestReleaseWakesAWaiterOfAnotherProcess(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	ctx := context.Background()
	for _, fair := range []bool{false, true} {
		var opts []lockkit.Option
		if fair {
			opts = append(opts, lockkit.WithFair())
		}
		holder, waiter := newLocker(t, newClient(t, addr)), newLocker(t, newClient(t, addr))
		key := uniqueKey(t)
		lease := hold(t, holder, key, append(opts, lockkit.WithTTL(time.Minute))...)
		got := make(chan error, 1)
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			l, err := waiter.Acquire(wctx, key, opts...)
			if err == nil {
				err = l.Release(ctx)
			}
			got <- err
		}()
		time.Sleep(200 * time.Millisecond) // refused and subscribed
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Errorf("fair=%v: waiter: %v", fair, err)
		}
	}
}
