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

	"github.com/lockbench/shop/internal/lockkit"
)

// An owner whose lease ran out, and whose key another process then took,
// must not be handed a nested lease of the dead grant by Reentrant: two
// holders at once. Reentrant asks the lease's Lost with a select and a
// default; nobody had looked at Lost before.
func TestReentrantDoesNotNestAnExpiredLease(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	ctx := context.Background()
	l := lockkit.Reentrant(newLocker(t, newClient(t, addr)))
	other := newLocker(t, newClient(t, addr))
	key := uniqueKey(t)
	alice := lockkit.WithOwner(ctx, "alice")

	outer, err := l.TryAcquire(alice, key, lockkit.WithTTL(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer outer.Release(ctx)
	time.Sleep(200 * time.Millisecond) // the TTL runs out
	theirs, err := other.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("key free after the TTL, yet: %v", err)
	}
	defer theirs.Release(ctx)
	nested, err := l.TryAcquire(alice, key, lockkit.WithTTL(time.Minute))
	if err == nil {
		defer nested.Release(ctx)
		t.Fatal("alice was given a nested lease of her expired grant while another process holds the key")
	}
	if !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("alice's TryAcquire of a key another holds = %v, want ErrNotAcquired", err)
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
				buf := make([]byte, 32<<10)
				for {
					n, err := c.Read(buf)
					if n > 0 {
						if bytes.Contains(bytes.ToLower(buf[:n]), []byte("$9\r\nsubscribe\r\n")) {
							subscriber.Store(true)
						}
						if _, werr := s.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			})
			wg.Go(func() {
				defer c.Close()
				buf := make([]byte, 32<<10)
				for {
					n, err := s.Read(buf)
					if n > 0 && (subscriber.Load() || !d.drop.CompareAndSwap(true, false)) {
						if _, werr := c.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
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

// A waiter whose turn came from a grant here (so it does not ask Redis
// while that grant lasts) must still be woken when the grant's release
// frees the key but its reply is lost: nothing else will tell it, since
// it set no wanted mark, and it would sleep out the grant's whole TTL.
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

// Mixed waiters on one key, each in its own process: a plain waiter marks
// the key, a fair lease's release deletes the mark and names the fair
// head (which wakes that fair waiter only), and the fair waiter's own
// release then finds no mark and sends nothing. The plain waiter must
// still be woken by that second release, not by the first holder's TTL.
func TestPlainWaiterWokenAfterFairHandOffElsewhere(t *testing.T) {
	// The plain waiter may barge in first (it is woken by its own
	// subscription's confirmation, say): then the round shows nothing, and
	// another one runs.
	for range 5 {
		if plainWaiterWokenAfterFairHandOff(t) {
			return
		}
	}
	t.Fatal("the plain waiter took the key before the fair waiter in every round")
}

// plainWaiterWokenAfterFairHandOff runs one round; false if it showed
// nothing because the plain waiter was granted first.
func plainWaiterWokenAfterFairHandOff(t *testing.T) bool {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	ctx := context.Background()
	x := newLocker(t, newClient(t, addr))
	y := newLocker(t, newClient(t, addr))
	z := newLocker(t, newClient(t, addr))
	key := uniqueKey(t)

	held := hold(t, x, key, lockkit.WithFair())
	plain := acquireAsync(y, ctx, key, lockkit.WithWaitTimeout(20*time.Second))
	time.Sleep(300 * time.Millisecond) // refused, subscribed, marked
	fair := acquireAsync(z, ctx, key, lockkit.WithFair(), lockkit.WithWaitTimeout(20*time.Second))
	time.Sleep(300 * time.Millisecond) // queued
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	var got acquired
	select {
	case got = <-fair:
	case got = <-plain:
		if got.err == nil {
			_ = got.lease.Release(ctx)
		}
		if f := <-fair; f.err == nil {
			_ = f.lease.Release(ctx)
		}
		return false
	}
	if got.err != nil {
		t.Fatalf("fair waiter: %v", got.err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := got.lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	select {
	case p := <-plain:
		if p.err != nil {
			t.Fatalf("plain waiter, key free since %v: %v", time.Since(released), p.err)
		}
		if wait := p.at.Sub(released); wait > 2*time.Second {
			t.Errorf("plain waiter granted %v after the key was freed", wait)
		}
		_ = p.lease.Release(ctx)
	case <-time.After(5 * time.Second):
		lock := "{" + testPrefix + key + "}"
		t.Fatalf("plain waiter still asleep 5s after the fair holder's release; EXISTS %s = %d",
			lock, newClient(t, addr).Exists(ctx, lock).Val())
	}
	return true
}
