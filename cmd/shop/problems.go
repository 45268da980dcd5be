package main

import (
	"context"
	"database/sql/driver"
	"errors"
	"net"
	"net/http"
	"slices"
	"syscall"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/idem"
	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/like"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/optimistic"
	"github.com/lockbench/shop/internal/order"
	"github.com/lockbench/shop/internal/problem"
)

// errShuttingDown is the cause with which shutdown cancels the requests
// that outlived SHOP_SHUTDOWN_TIMEOUT: their transactions roll back, and
// the client is told to retry elsewhere.
var errShuttingDown = errors.New("this instance is shutting down")

// problems is the one table from errors to the problems the API answers
// with; docs/api.md explains each type. The first matching row decides, so
// the catch-alls for broken connections and contexts come last. Errors
// made on the spot (*problem.Error: bad input, auth, Idempotency-Key) carry
// their own status and need no row.
func problems() problem.Table {
	return slices.Concat(
		lockProblems(),
		account.Problems(), inventory.Problems(), like.Problems(), order.Problems(), audit.Problems(), idem.Problems(),
		dependencyProblems(),
	)
}

// lockProblems: a lock held by someone else for longer than the wait
// timeout, a lease lost before the write, a write conflict that outlasted
// the retries. The request changed nothing, the same request will most
// likely succeed in a moment, and the cause is on the server side
// (contention, a slow holder), not in what the client sent. 503 +
// Retry-After says exactly that; 409 would tell the client that its request
// conflicts with the resource's state, and that a retry is pointless until
// the client changes something.
//
// lockkit's messages are written for programmers; the details say what
// happened to the client's request.
func lockProblems() []problem.Mapping {
	const unavailable = http.StatusServiceUnavailable
	return []problem.Mapping{
		{Target: errShuttingDown, Status: unavailable, Slug: "shutting-down", Title: "Shutting down", RetryAfter: 1,
			Detail: "this instance is shutting down and stopped the request before it finished; retry it"},
		{Target: lockkit.ErrNotAcquired, Status: unavailable, Slug: "lock-busy", Title: "Lock busy", RetryAfter: 1,
			Detail: "the lock this request needs stayed busy for the whole wait timeout; nothing was changed"},
		{Target: lockkit.ErrLeaseLost, Status: unavailable, Slug: "lease-lost", Title: "Lock lease lost", RetryAfter: 1,
			Detail: "this request's lock lease ended before its write; nothing was changed"},
		{Target: lockkit.ErrFenced, Status: unavailable, Slug: "fenced", Title: "Write refused: stale lock", RetryAfter: 1,
			Detail: "this request's lock lease expired and a later holder wrote first; the stale write was refused and nothing was changed"},
		{Target: lockkit.ErrUnavailable, Status: unavailable, Slug: "unavailable", Title: "Dependency unavailable", RetryAfter: 1,
			Detail: "the lock server is unreachable; nothing was changed"},
		{Target: lockkit.ErrClosed, Status: unavailable, Slug: "shutting-down", Title: "Shutting down", RetryAfter: 1,
			Detail: "this instance is shutting down; nothing was changed"},
		{Target: optimistic.ErrConflict, Status: unavailable, Slug: "conflict", Title: "Write conflict", RetryAfter: 1},
	}
}

// dependencyProblems classify the failures of the database and Redis that
// no store wraps in a sentinel, and the request's own context ending.
func dependencyProblems() []problem.Mapping {
	const unavailable = http.StatusServiceUnavailable
	return []problem.Mapping{
		// The driver sent a statement and the connection broke before the
		// reply: a COMMIT may have landed (seen in TestLockServerRestart:
		// a deposit answered so was in the balance). Neither "nothing was
		// changed" nor a bug; and no Retry-After, which would invite a
		// blind retry of a change that may have been applied.
		{Target: mysql.ErrInvalidConn, Status: unavailable, Slug: "outcome-unknown", Title: "Outcome unknown",
			Detail: "the database connection broke before it confirmed this request's change, which may or may not have been applied. " +
				"Sent with an Idempotency-Key: send it again with the same key; the retry answers the first outcome and applies nothing twice. " +
				"Sent without one: read the resource first (GET the account, product or order) and send it again only if the change is not there"},
		{Match: rolledBack, Status: unavailable, Slug: "conflict", Title: "Write conflict", RetryAfter: 1,
			Detail: "the database rolled back this request's transaction (a deadlock or a lock wait with another transaction); nothing was changed; retry it"},
		{Match: unreachable, Status: unavailable, Slug: "unavailable", Title: "Dependency unavailable", RetryAfter: 1,
			Detail: "a server this request needs is unreachable; nothing was changed"},
		{Target: context.DeadlineExceeded, Status: unavailable, Slug: "timeout", Title: "Timed out", RetryAfter: 1,
			Detail: "the request ran out of time before it could finish"},
		// The client went away, or the server is stopping: nobody reads
		// this, but the log and the metrics should not call it a 500.
		{Target: context.Canceled, Status: unavailable, Slug: "cancelled", Title: "Cancelled",
			Detail: "the request was cancelled before it finished"},
	}
}

// rolledBack reports the InnoDB errors after which the transaction did not
// commit: 1213, the deadlock victim, is rolled back whole by the server;
// 1205, a lock wait timeout, fails its statement, and the store's
// transaction then rolls back. Both are transient (a concurrent reset
// provokes them), so a retry is the answer, not a 500 that an
// Idempotency-Key would keep for good.
func rolledBack(err error) bool {
	var me *mysql.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// unreachable reports a connection-level failure to a backing server: the
// lock backend or the database when it does not wrap ErrUnavailable itself.
func unreachable(err error) bool {
	var opErr *net.OpError
	var dnsErr *net.DNSError
	return errors.As(err, &opErr) || errors.As(err, &dnsErr) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, redis.ErrClosed)
}
