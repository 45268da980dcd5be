package mysqllock

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// held is a lease's connection, inside the lock transaction.
//
// The row is freed when the connection goes, so the connection goes only
// after the lease's Lost has closed: a holder must stop trusting its lease
// before the next one is granted.
type held struct {
	mu     sync.Mutex
	conn   *sql.Conn     // nil once the lease is over
	expiry *time.Timer   // runs drop when the lease's TTL has run out unrenewed
	lease  lockkit.Lease // nil until the grant is complete
	gone   chan struct{} // closed to close the lease's Lost
	kill   func()        // KILLs the connection's session
	// ended is closed once a connection ended because its caller's ctx
	// ended is gone, and the row with it: a release called again after
	// such a release answers nil then.
	ended chan struct{}
}

// exec runs query on the lease's connection, and gives the connection back
// to the pool after it when last is set. Any failure ends the lease: Lost
// first, then the connection, whose transaction the server rolls back.
//
// The statement does not see ctx: the driver would answer ctx's end by
// closing the socket, freeing the row while Lost is still open. ctx's end
// returns at once instead; once Lost has closed, the session is KILLed,
// which ends the statement, and the connection goes.
func (h *held) exec(ctx context.Context, last bool, query string, args ...any) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn == nil {
		return lockkit.ErrNotHeld
	}
	conn := h.conn
	done := make(chan error, 1)
	go func() {
		_, err := conn.ExecContext(context.WithoutCancel(ctx), query, args...)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-ctx.Done():
		h.conn, h.ended = nil, make(chan struct{})
		h.end(conn, func() {
			h.kill()
			<-done
		})
		if last {
			return context.Cause(ctx) // the row is freed in the background
		}
		return fmt.Errorf("%w: %w", lockkit.ErrNotHeld, context.Cause(ctx))
	}
	if err != nil {
		h.conn = nil
		h.end(conn, nil)
		return fmt.Errorf("%w: the lock connection failed: %w", lockkit.ErrNotHeld, err)
	}
	if last {
		h.expiry.Stop()
		_ = conn.Close()
		h.conn = nil
	}
	return nil
}

// end closes the lease's Lost and, once it has closed, runs stop (if any)
// and discards conn. It does not wait: the lease closes Lost when it sees
// the error its caller returns, or sees gone, from goroutines of its own,
// which may wait for the caller.
func (h *held) end(conn *sql.Conn, stop func()) {
	select {
	case <-h.gone:
	default:
		close(h.gone)
	}
	lease, ended := h.lease, h.ended
	go func() {
		if lease != nil {
			<-lease.Lost()
		}
		if stop != nil {
			stop()
		}
		discard(conn)
		if ended != nil {
			close(ended)
		}
	}()
}

// release commits the transaction, or, after a release whose ctx ended
// had the session KILLed, waits for that KILL to free the row.
func (h *held) release(ctx context.Context, query string, key []byte) error {
	h.mu.Lock()
	ended := h.ended
	h.mu.Unlock()
	if ended == nil {
		return h.exec(ctx, true, query, key)
	}
	select {
	case <-ended:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (h *held) extend(ctx context.Context, ttl time.Duration) error {
	// Measured after the lease measured its own start of the new TTL, so
	// the connection is never dropped before the lease is lost.
	sent := time.Now()
	if err := h.exec(ctx, false, forUpdateExtend, seconds(ttl)); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn != nil {
		h.expiry.Reset(time.Until(sent.Add(ttl)))
	}
	return nil
}

// drop ends a lease whose TTL ran out unrenewed: once Lost has closed (at
// this same deadline, or a later one if a renewal moved it), its connection
// is closed, and the server rolls the transaction back at once rather than
// when wait_timeout runs out. The connection goes even if the holder never
// calls Release.
func (h *held) drop() {
	h.mu.Lock()
	lease := h.lease
	h.mu.Unlock()
	<-lease.Lost()
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.conn != nil {
		discard(h.conn)
		h.conn = nil
	}
}
