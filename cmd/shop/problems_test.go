package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/optimistic"
	"github.com/lockbench/shop/internal/problem"
)

// TestProblems: the table answers the server-side failures as docs/api.md
// promises, without a word of their internals.
func TestProblems(t *testing.T) {
	table := problems()
	for _, tc := range []struct {
		name       string
		err        error
		status     int
		slug       string
		detail     string
		retryAfter string
	}{
		{"domain-wrapped", fmt.Errorf("%w: 1 left, 2 asked", inventory.ErrSoldOut), 409, "sold-out", "sold out: 1 left, 2 asked", ""},
		{"fenced", fmt.Errorf("account 1: %w", lockkit.ErrFenced), 503, "fenced", "stale write was refused", "1"},
		{"busy", lockkit.ErrNotAcquired, 503, "lock-busy", "wait timeout", "1"},
		{"lease-lost", lockkit.ErrLeaseLost, 503, "lease-lost", "lease ended before its write", "1"},
		{"unavailable-hides-address", fmt.Errorf("%w: dial 10.0.0.7:6379", lockkit.ErrUnavailable), 503, "unavailable", "lock server is unreachable", "1"},
		{"closed", lockkit.ErrClosed, 503, "shutting-down", "shutting down; nothing was changed", "1"},
		{"shutting-down", fmt.Errorf("deposit: %w", errShuttingDown), 503, "shutting-down", "stopped the request", "1"},
		// Shutdown cancels with a cause; the cause decides, not the
		// cancellation it comes with.
		{"shutting-down-beats-cancelled", errors.Join(context.Canceled, errShuttingDown), 503, "shutting-down", "stopped the request", "1"},
		{"conflict", fmt.Errorf("account 1: %w", optimistic.ErrConflict), 503, "conflict", "write conflict", "1"},
		{"net-error", &net.OpError{Op: "dial", Err: errors.New("refused 10.0.0.7")}, 503, "unavailable", "unreachable", "1"},
		{"redis-closed", fmt.Errorf("get: %w", redis.ErrClosed), 503, "unavailable", "unreachable", "1"},
		// A statement whose connection MariaDB closed before the reply, as
		// it stopped: seen in make faults, TestLockServerRestart, from the
		// account store, which passes gorm's errors up unwrapped. It may
		// have committed, so it is neither unavailable (nothing changed)
		// nor internal; and no Retry-After.
		{"mysql-reply-lost", fmt.Errorf("deposit: %w", mysql.ErrInvalidConn), 503, "outcome-unknown", "may or may not have been applied", ""},
		// InnoDB rolled the transaction back (deadlock victim) or the
		// statement waited out innodb_lock_wait_timeout and the store
		// rolled back: nothing landed, and the retry most likely runs.
		{"mysql-deadlock-victim", fmt.Errorf("reset race: %w", &mysql.MySQLError{Number: 1213, Message: "Deadlock found when trying to get lock; try restarting transaction"}), 503, "conflict", "rolled back", "1"},
		{"mysql-lock-wait-timeout", &mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded; try restarting transaction"}, 503, "conflict", "rolled back", "1"},
		{"mysql-statement-error", &mysql.MySQLError{Number: 1146, Message: "Table 'secret' doesn't exist"}, 500, "internal", "request id", ""},
		{"timeout", fmt.Errorf("read: %w", context.DeadlineExceeded), 503, "timeout", "ran out of time", "1"},
		{"cancelled", context.Canceled, 503, "cancelled", "cancelled before it finished", ""},
		{"internal-hides-message", errors.New("pq: secret table missing"), 500, "internal", "request id", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, h := table.From(tc.err)
			if d.Status != tc.status || d.Type != problem.TypeBase+tc.slug || !strings.Contains(d.Detail, tc.detail) ||
				h.Get("Retry-After") != tc.retryAfter || d.Title == "" {
				t.Errorf("From(%v) = %+v, Retry-After %q", tc.err, d, h.Get("Retry-After"))
			}
			if strings.Contains(d.Detail, "secret") || strings.Contains(d.Detail, "10.0.0.7") {
				t.Errorf("detail leaks internals: %q", d.Detail)
			}
		})
	}
}

// TestProblemRowsAreWhole: each row matches by one means, answers with a
// status, type and title, and no sentinel has two rows (the second would
// never be reached).
func TestProblemRowsAreWhole(t *testing.T) {
	seen := map[error]bool{}
	for i, m := range problems() {
		if (m.Target == nil) == (m.Match == nil) || m.Status < 400 || m.Slug == "" || m.Title == "" {
			t.Errorf("row %d (%s) is not whole: %+v", i, m.Slug, m)
		}
		if m.Target != nil && seen[m.Target] {
			t.Errorf("row %d (%s): %v has a row already", i, m.Slug, m.Target)
		}
		seen[m.Target] = true
	}
}
