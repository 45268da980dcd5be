package mysqllock_test

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/lockbench/shop/internal/lockkit"
)

// breaker is a loopback TCP proxy to the database that, once armed, cuts
// the next connection the client writes on: the request is swallowed and
// both sides closed, as a proxy idling it out, a KILL or a reset would.
// Every other connection and every later write passes.
type breaker struct {
	armed  atomic.Bool
	broken atomic.Int64
}

func newBreaker(t *testing.T, dsn string) (*breaker, string) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	server := cfg.Addr
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	b := &breaker{}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			srv, err := net.Dial("tcp", server)
			if err != nil {
				_ = client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, srv)
			mu.Unlock()
			go func() { _, _ = io.Copy(client, srv); _ = client.Close() }()
			go func() {
				buf := make([]byte, 64<<10)
				for {
					n, err := client.Read(buf)
					if n > 0 {
						if b.armed.CompareAndSwap(true, false) {
							b.broken.Add(1)
							_ = client.Close()
							_ = srv.Close()
							return
						}
						if _, werr := srv.Write(buf[:n]); werr != nil {
							return
						}
					}
					if err != nil {
						_ = srv.Close()
						return
					}
				}
			}()
		}
	}()
	cfg.Addr = ln.Addr().String()
	return b, cfg.FormatDSN()
}

// One connection cut in the middle of the head's grant statement is one
// transient failure, the kind a single waiter of the old loop met alone
// (and a pool hands out a fresh connection for the next statement). With
// the line and Outage: 1, the head's one failure is the verdict for
// everyone in line: all five waiters fail with ErrUnavailable, though the
// server is up and the key is released a moment later.
func TestReviewLeaseRowOneBrokenConnectionDoesNotFailTheWholeLine(t *testing.T) {
	dsn := testDSN(t)
	brk, viaBreaker := newBreaker(t, dsn)
	holderL, l := newLeaseLocker(t, dsn), newLeaseLocker(t, viaBreaker)
	defer holderL.Close()
	defer l.Close()
	ctx, key := context.Background(), "mysqllock:"+t.Name()+":"+time.Now().Format("150405.000000")
	holder, err := holderL.Acquire(ctx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	const waiters = 5
	errs := make(chan error, waiters)
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	for range waiters {
		go func() {
			lease, err := l.Acquire(wctx, key, lockkit.WithTTL(time.Minute))
			if err == nil {
				time.Sleep(time.Millisecond)
				err = lease.Release(ctx)
			}
			errs <- err
		}()
	}
	time.Sleep(300 * time.Millisecond) // all in line, the head polling
	brk.armed.Store(true)
	deadline := time.Now().Add(5 * time.Second)
	for brk.broken.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if brk.broken.Load() == 0 {
		t.Fatal("the head made no statement to cut")
	}
	time.Sleep(100 * time.Millisecond)
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	failed := 0
	for range waiters {
		if err := <-errs; err != nil {
			failed++
			t.Logf("waiter: %v", err)
			if !errors.Is(err, lockkit.ErrUnavailable) {
				t.Errorf("waiter: %v, want nil or ErrUnavailable", err)
			}
		}
	}
	if failed > 1 {
		t.Fatalf("one connection cut mid-statement failed %d of %d waiters with ErrUnavailable; "+
			"at most the one whose statement it was should fail", failed, waiters)
	}
}
