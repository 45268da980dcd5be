package redislock_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
)

// The head's verdict that Redis cannot be reached ends the wait of every
// plain waiter behind it (backend.Line): they need not each find out.
func TestOutageSeenByHeadEndsTheLine(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	p := newProxy(t, addr)
	holder := newLocker(t, newClient(t, addr))
	c := redis.NewClient(&redis.Options{Addr: p.addr, ContextTimeoutEnabled: true,
		ReadTimeout: 200 * time.Millisecond, WriteTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	l := newLocker(t, c)
	ctx := context.Background()
	key := uniqueKey(t)

	// Not renewed: the head looks again when it runs out.
	held, err := holder.TryAcquire(ctx, key, lockkit.WithTTL(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Release(ctx)
	var waiters []<-chan acquired
	for range 3 {
		waiters = append(waiters, acquireAsync(l, ctx, key, lockkit.WithWaitTimeout(20*time.Second)))
		time.Sleep(50 * time.Millisecond) // in line in this order
	}
	p.blackhole(true)
	defer p.blackhole(false)
	for i, w := range waiters {
		select {
		case got := <-w:
			if !errors.Is(got.err, lockkit.ErrUnavailable) {
				t.Fatalf("waiter %d behind a head that found Redis unreachable: %v, want ErrUnavailable", i, got.err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("waiter %d still waits after the head found Redis unreachable", i)
		}
	}
}

// replyDropper forwards TCP to a Redis server and, once drop is set,
// throws away the next reply on a command connection (not a subscriber's):
// a request is applied, its reply never arrives.
type replyDropper struct {
	addr string
	drop atomic.Bool
}

func newReplyDropper(t *testing.T, target string) *replyDropper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &replyDropper{addr: ln.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, c, s)
			mu.Unlock()
			var subscriber atomic.Bool
			wg.Go(func() {
				defer s.Close()
				forwardRequests(c, s, &subscriber)
			})
			wg.Go(func() {
				defer c.Close()
				d.forwardReplies(s, c, &subscriber)
			})
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return d
}

// forwardRequests copies a client's requests to the server and notes a
// subscriber's connection.
func forwardRequests(client, server net.Conn, subscriber *atomic.Bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := client.Read(buf)
		if n > 0 {
			if bytes.Contains(bytes.ToLower(buf[:n]), []byte("$9\r\nsubscribe\r\n")) {
				subscriber.Store(true)
			}
			if _, werr := server.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// forwardReplies copies the server's replies to the client, but for the
// one drop asks for on a command connection.
func (d *replyDropper) forwardReplies(server, client net.Conn, subscriber *atomic.Bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 && (subscriber.Load() || !d.drop.CompareAndSwap(true, false)) {
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// A waiter whose turn came from a grant here (so it does not ask Redis
// while that grant lasts) must still be woken when the grant's release
// frees the key but its reply is lost: nothing else will tell it, since
// it did not mark the lease, and it would sleep out the grant's whole TTL.
func TestWaiterBehindGrantHereWokenWhenReleaseReplyLost(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	d := newReplyDropper(t, addr)
	admin := newClient(t, addr)
	holder := newLocker(t, newClient(t, addr))
	l := newLocker(t, newClient(t, d.addr))
	ctx := context.Background()
	key := uniqueKey(t)

	held := hold(t, holder, key)
	first := acquireAsync(l, ctx, key, lockkit.WithWaitTimeout(10*time.Second))
	time.Sleep(200 * time.Millisecond) // refused, subscribed, marked
	second := acquireAsync(l, ctx, key, lockkit.WithWaitTimeout(10*time.Second))
	time.Sleep(200 * time.Millisecond) // queued behind first
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	got := <-first
	if got.err != nil {
		t.Fatal(got.err)
	}
	time.Sleep(100 * time.Millisecond) // second is head now, behind a grant here

	d.drop.Store(true)
	rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	err := got.lease.Release(rctx)
	cancel()
	if err == nil {
		t.Fatal("Release's reply was dropped, yet it returned nil")
	}
	released := time.Now()
	select {
	case g := <-second:
		if g.err != nil {
			t.Fatalf("second waiter, key free since %v: %v", time.Since(released), g.err)
		}
		if wait := g.at.Sub(released); wait > 2*time.Second {
			t.Errorf("second waiter granted %v after the key was freed", wait)
		}
		_ = g.lease.Release(ctx)
	case <-time.After(5 * time.Second):
		// The release was applied: the key is free, and nobody takes it.
		lock := "{" + testPrefix + key + "}"
		t.Fatalf("second waiter still asleep 5s after the release (its TTL is a minute); EXISTS %s = %d",
			lock, admin.Exists(ctx, lock).Val())
	}
}

// One reply lost on a healthy Redis is weather, not an outage: it may end
// the wait of the head whose call it was, but the waiters behind it are
// granted once the key is free.
func TestLostReplyDoesNotEndTheLine(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	d := newReplyDropper(t, addr)
	holder := newLocker(t, newClient(t, addr))
	c := redis.NewClient(&redis.Options{Addr: d.addr, ContextTimeoutEnabled: true,
		ReadTimeout: 200 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	l := newLocker(t, c)
	ctx := context.Background()
	key := uniqueKey(t)

	held := hold(t, holder, key)
	var waiters []<-chan acquired
	for range 3 {
		waiters = append(waiters, acquireAsync(l, ctx, key, lockkit.WithWaitTimeout(20*time.Second)))
		time.Sleep(200 * time.Millisecond) // in line in this order, the head asleep
	}
	d.drop.Store(true) // the reply to the head's look once the key frees
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for i, w := range waiters {
		select {
		case got := <-w:
			switch {
			case got.err == nil:
				_ = got.lease.Release(ctx)
			case i > 0 || !errors.Is(got.err, lockkit.ErrUnavailable):
				t.Fatalf("waiter %d, one reply lost on a healthy Redis: %v", i, got.err)
			}
		case <-time.After(15 * time.Second):
			t.Fatalf("waiter %d still waits after one lost reply", i)
		}
	}
}
