// Package mysqllock holds the two lockkit backends that keep their locks in
// MySQL/MariaDB.
//
//   - New, config name "mysql": a lease row per key. A grant is one
//     conditional upsert; the lease lives on the database's clock, and
//     nothing stays open between statements, so the service's own pool
//     serves it. Waiters poll.
//   - NewForUpdate, config name "mysql-forupdate": the row lock of a
//     transaction kept open for the whole lease on a connection of its own.
//     Waiters block on the row lock itself; the server ends the lease when
//     its holder goes quiet for the TTL. Needs MariaDB 10.3 or later.
//
// docs/backends-mysql.md compares them and argues each decision.
package mysqllock

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/lockkit"
)

// MaxKeyLen is the longest key, in bytes, that the lock tables hold.
const MaxKeyLen = 255

// ErrKeyTooLong is returned for a key longer than MaxKeyLen bytes. Keys are
// never truncated: two long keys cut to the same prefix would share a lock.
var ErrKeyTooLong = fmt.Errorf("mysqllock: key longer than %d bytes", MaxKeyLen)

// Option configures New or NewForUpdate.
type Option func(*config)

type config struct {
	table            string
	minPoll, maxPoll time.Duration
	idleConns        int
}

// WithTable names the lock table (default "locks" for New, "row_locks" for
// NewForUpdate; NewForUpdate also creates a sequence named <table>_fence).
// It is created if missing.
func WithTable(name string) Option { return func(c *config) { c.table = name } }

// WithPoll bounds the interval between a New Locker's attempts while it
// waits for a key held by another process: it starts at min and doubles up
// to max, with jitter (defaults 2 ms and 10 ms). Only the first of a
// Locker's waiters for a key polls, so the row sees at most about 1/max
// grant statements a second per process; max also bounds how long a waiter
// in another process waits to notice a release, since a Locker whose line
// never empties lets the key go for max every backend.HandOffRun
// hand-offs. NewForUpdate ignores it.
func WithPoll(min, max time.Duration) Option {
	return func(c *config) { c.minPoll, c.maxPoll = min, max }
}

// WithIdleConns sets how many connections a NewForUpdate Locker keeps open
// between leases (default 16). Each lease and each waiter holds a
// connection for as long as it lasts, and more are opened when these are in
// use: there is no cap below the server's max_connections, because a
// caller holding leases that waits for a connection only its own leases
// could return waits for ever. Budget the server's max_connections (151 by
// default) for the deepest nesting times the concurrent requests, plus the
// service's own pool, for every instance; past it the server refuses the
// connection and the grant fails with lockkit.ErrUnavailable at once. New
// ignores it.
func WithIdleConns(n int) Option { return func(c *config) { c.idleConns = n } }

// WithMaxConns is WithIdleConns.
//
// Deprecated: it capped the pool, which deadlocked nested locks beyond the
// cap; it now sets only the connections kept idle.
func WithMaxConns(n int) Option { return WithIdleConns(n) }

var tableName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,50}$`)

func configure(opts []Option, table string) (config, error) {
	c := config{table: table, minPoll: 2 * time.Millisecond, maxPoll: 10 * time.Millisecond, idleConns: 16}
	for _, opt := range opts {
		opt(&c)
	}
	// The name is spliced into SQL text: only plain identifiers pass.
	if !tableName.MatchString(c.table) {
		return c, fmt.Errorf("mysqllock: table name %q is not a plain identifier", c.table)
	}
	if c.minPoll <= 0 || c.maxPoll < c.minPoll {
		return c, fmt.Errorf("mysqllock: poll interval [%v, %v] is empty", c.minPoll, c.maxPoll)
	}
	if c.idleConns < 0 {
		return c, fmt.Errorf("mysqllock: idle conns %d < 0", c.idleConns)
	}
	return c, nil
}

// sql fills a statement template with the table's (and its sequence's) name.
func (c config) sql(template string) string {
	return strings.NewReplacer("{table}", "`"+c.table+"`", "{seq}", "`"+c.table+"_fence`").Replace(template)
}

// setupContext is the context the constructors create tables under: the one
// db carries (db.WithContext), bounded so that a dead server fails start-up.
func setupContext(db *gorm.DB) (context.Context, context.CancelFunc) {
	ctx := context.Background()
	if db.Statement != nil && db.Statement.Context != nil {
		ctx = db.Statement.Context
	}
	return context.WithTimeout(ctx, 30*time.Second)
}

func checkKey(key string) error {
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: %d bytes", ErrKeyTooLong, len(key))
	}
	return nil
}

// Server errors that mean "the server cannot serve you now", not "your
// statement is wrong": too many connections, shutting down, read-only (a
// failover in progress), connection killed.
var unavailableCodes = map[uint16]bool{1040: true, 1053: true, 1290: true, 1836: true, 1927: true}

// unavailable wraps failures to reach the server with lockkit.ErrUnavailable
// so that callers answer 503. Context errors are the caller's own and pass
// through, as do errors the server reported about a statement.
func unavailable(err error) error {
	var myErr *mysql.MySQLError
	switch {
	case err == nil:
		return nil
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.As(err, &myErr) && !unavailableCodes[myErr.Number]:
		return fmt.Errorf("mysqllock: %w", err)
	}
	// Anything else came from below SQL: a refused or broken connection
	// (driver.ErrBadConn, mysql.ErrInvalidConn, net errors), a closed pool.
	return fmt.Errorf("%w: %w", lockkit.ErrUnavailable, err)
}

// isCode reports whether err is the server error number code.
func isCode(err error, code uint16) bool {
	var myErr *mysql.MySQLError
	return errors.As(err, &myErr) && myErr.Number == code
}

// badConn, returned from (*sql.Conn).Raw, makes database/sql close the
// connection instead of pooling it: its session state is unknown.
var badConn = driver.ErrBadConn
