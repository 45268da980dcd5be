package mysqllock_test

import (
	"context"
	"crypto/rand"
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

// Expiry is judged by the database's clock alone. Moving the row's expiry
// into the database's past frees the key at once, though no client clock
// has reached the TTL; and the row's expiry is TTL ahead of the database's
// clock, whatever the client's says.
func TestLeaseRowTimedOnDatabaseClock(t *testing.T) {
	dsn := testDSN(t)
	a, b := newLeaseLocker(t, dsn), newLeaseLocker(t, dsn)
	defer a.Close()
	defer b.Close()
	ctx, key := context.Background(), "mysqllock:"+t.Name()

	la := mustTry(t, a, key, lockkit.WithTTL(time.Minute))
	var left time.Duration
	db, sqlDB := openDB(t, dsn)
	defer sqlDB.Close()
	err := db.Raw("SELECT TIMESTAMPDIFF(MICROSECOND, UTC_TIMESTAMP(6), expires_at) * 1000 FROM "+leaseTable+
		" WHERE name = ?", key).Scan(&left).Error
	if err != nil {
		t.Fatal(err)
	}
	if left <= 0 || left > time.Minute {
		t.Fatalf("lease row expires %v after the database's now, want within (0, 1m]", left)
	}
	if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("TryAcquire of a held key = %v, want ErrNotAcquired", err)
	}

	execSQL(t, dsn, "UPDATE "+leaseTable+" SET expires_at = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE name = ?", key)
	lb := mustTry(t, b, key, lockkit.WithTTL(time.Minute))
	defer lb.Release(ctx)
	if lb.Fence() <= la.Fence() {
		t.Fatalf("takeover of an expired row has fence %d, want above %d", lb.Fence(), la.Fence())
	}
	if err := la.Extend(ctx, time.Minute); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("extend of an expired lease = %v, want ErrNotHeld", err)
	}
}

// Close ends waits at once, on both backends.
func TestCloseEndsWaits(t *testing.T) {
	dsn := testDSN(t)
	for name, open := range map[string]func(testing.TB, string) lockkit.Locker{"mysql": newLeaseLocker, "mysql-forupdate": newRowLocker} {
		t.Run(name, func(t *testing.T) {
			a, b := open(t, dsn), open(t, dsn)
			defer a.Close()
			ctx, key := context.Background(), "mysqllock:"+t.Name()
			la := mustTry(t, a, key, lockkit.WithTTL(time.Minute))
			defer la.Release(ctx)
			waited := make(chan error, 1)
			go func() {
				_, err := b.Acquire(ctx, key)
				waited <- err
			}()
			time.Sleep(50 * time.Millisecond) // let b start waiting
			_ = b.Close()
			select {
			case err := <-waited:
				if !errors.Is(err, lockkit.ErrClosed) {
					t.Fatalf("Acquire ended by Close = %v, want ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close did not end a wait")
			}
		})
	}
}

// A grant the server made but whose reply never arrived (the connection
// broke in between) is given back at once, though the caller's context is
// still live: otherwise an owner nobody knows holds the key for a whole TTL.
func TestLeaseRowLostGrantReplyIsReleased(t *testing.T) {
	dsn := testDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := newReplyCutter(t, cfg.Addr)
	cfg.Addr = p.addr
	l := newLeaseLocker(t, cfg.FormatDSN())
	defer l.Close()
	other := newLeaseLocker(t, dsn)
	defer other.Close()
	// A key of its own: a failed run leaves its key held for a minute.
	ctx, key := context.Background(), "mysqllock:"+t.Name()+":"+rand.Text()
	fence := func() (f int64) {
		db, sqlDB := openDB(t, dsn)
		defer sqlDB.Close()
		_ = db.Raw("SELECT COALESCE(MAX(fence), 0) FROM "+leaseTable+" WHERE name = ?", key).Scan(&f).Error
		return f
	}
	before := fence()

	p.cutNextExecute()
	if _, err := l.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute)); !errors.Is(err, lockkit.ErrUnavailable) {
		t.Fatalf("TryAcquire whose reply was lost = %v, want ErrUnavailable", err)
	}
	if !p.cut() {
		t.Fatal("the proxy saw no grant to cut")
	}
	if fence() == before {
		t.Fatal("the grant never reached the server: the test proves nothing")
	}
	waitUntil(t, "the lost grant to be given back", func() bool {
		lease, err := other.TryAcquire(ctx, key)
		if err == nil {
			_ = lease.Release(ctx)
		}
		return err == nil
	})
}

// A lease row that was deleted (by hand, a restore, a truncated table)
// starts again with a fence above every one it gave before: the stores
// keep the highest fence they saw and would refuse every later write.
func TestLeaseRowFenceSurvivesDeletedRow(t *testing.T) {
	dsn := testDSN(t)
	l := newLeaseLocker(t, dsn)
	defer l.Close()
	ctx, key := context.Background(), "mysqllock:"+t.Name()
	var last uint64
	for range 2 {
		lease := mustTry(t, l, key)
		last = lease.Fence()
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	execSQL(t, dsn, "DELETE FROM "+leaseTable+" WHERE name = ?", key)
	lease := mustTry(t, l, key)
	defer lease.Release(ctx)
	if lease.Fence() <= last {
		t.Fatalf("after the row was deleted the fence went back from %d to %d", last, lease.Fence())
	}
}

// replyCutter is a TCP proxy to a MySQL server that can break the
// connection after the server has run a statement and before its reply
// reaches the client.
type replyCutter struct {
	addr     string
	mu       sync.Mutex
	armed    bool // cut at the next COM_STMT_EXECUTE
	dropping bool // the next reply is dropped and the connection cut
	done     bool
	holed    bool // nothing is forwarded any more, connections left open
	muted    bool // the server's replies are no longer forwarded; requests still are
	conns    []net.Conn
}

// blackhole stops forwarding anything, either way, on every connection,
// old and new, and leaves them open: a server that stopped answering.
func (p *replyCutter) blackhole() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holed = true
}

// mute stops forwarding the server's replies, on every connection, and
// leaves them open; the client's requests still reach the server.
func (p *replyCutter) mute() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.muted = true
}

func (p *replyCutter) isMuted() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holed || p.muted
}

func (p *replyCutter) isHoled() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.holed
}

func newReplyCutter(t testing.TB, server string) *replyCutter {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyCutter{addr: ln.Addr().String()}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.conns {
			c.Close() // the server ends the sessions behind a black hole
		}
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go p.serve(client, server)
		}
	}()
	return p
}

// cutNextExecute arms the proxy: the next COM_STMT_EXECUTE is forwarded,
// the server's reply read and dropped, and both connections closed.
func (p *replyCutter) cutNextExecute() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.armed = true
}

func (p *replyCutter) cut() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.done
}

func (p *replyCutter) serve(client net.Conn, addr string) {
	defer client.Close()
	server, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer server.Close()
	p.mu.Lock()
	p.conns = append(p.conns, client, server)
	p.mu.Unlock()
	go func() {
		defer client.Close()
		defer server.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := server.Read(buf)
			if err != nil {
				return
			}
			p.mu.Lock()
			drop := p.dropping
			if drop {
				p.dropping, p.done = false, true
			}
			p.mu.Unlock()
			if drop {
				return // the server has answered: it ran the statement
			}
			if p.isMuted() {
				continue
			}
			if _, err := client.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := client.Read(buf)
		if err != nil {
			return
		}
		// A packet is [3-byte length][sequence][command]...; 0x17 is
		// COM_STMT_EXECUTE.
		p.mu.Lock()
		if p.armed && n >= 5 && buf[4] == 0x17 {
			p.armed, p.dropping = false, true
		}
		p.mu.Unlock()
		if p.isHoled() {
			continue
		}
		if _, err := server.Write(buf[:n]); err != nil {
			return
		}
	}
}

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
func TestLeaseRowOneBrokenConnectionDoesNotFailTheWholeLine(t *testing.T) {
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
