package mysqllock

import (
	"cmp"
	"context"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

var (
	//go:embed forupdate_schema.sql
	forUpdateSchema string
	//go:embed forupdate_grant.sql
	forUpdateGrant string
)

const (
	noWait = "SET STATEMENT innodb_lock_wait_timeout = 0 FOR"
	// wait_timeout goes back to DEFAULT (the global value) so that the
	// connection may idle in the pool again.
	forUpdateRelease = "DO RELEASE_LOCK(SHA1(?)); COMMIT; SET SESSION wait_timeout = DEFAULT"
	forUpdateExtend  = "SET SESSION wait_timeout = ?"
	// killTimeout bounds the KILL sent for a cancelled waiter, which
	// waits for it at most hangUpWait before it hangs up.
	killTimeout = 2 * time.Second
	hangUpWait  = 50 * time.Millisecond
)

// sessionLimits are set on every connection of a ForUpdateLocker's pool,
// whatever the server's globals say, so that only the caller's context ends
// a wait and only wait_timeout, which the lease sets to its TTL, ends a
// quiet lease. An idle-transaction timeout shorter than the TTL would end
// leases while their holders still trust them.
var sessionLimits = map[string]string{
	// Its maximum (34 years), not the default 50 s: waits end through KILL.
	"innodb_lock_wait_timeout":          "1073741824",
	"max_statement_time":                "0",
	"idle_transaction_timeout":          "0",
	"idle_write_transaction_timeout":    "0",
	"idle_readonly_transaction_timeout": "0",
}

// ForUpdateLocker is the "mysql-forupdate" backend: a lease is the row lock
// of a transaction held open, on a connection of its own, until Release
// commits it.
//
// Waiters block on the row lock itself and are granted it as soon as the
// holder commits: no polling. Nothing is written to the row, so a commit
// flushes nothing. The fence comes from a sequence drawn after the lock is
// granted, so it survives a holder whose transaction is rolled back.
// IS_USED_LOCK(SHA1(key)) names the holder's session, for an operator. The server enforces the TTL: the held session's wait_timeout is
// the TTL rounded up to whole seconds, so a holder that goes quiet (paused,
// partitioned) is disconnected and rolled back; a holder that dies is
// rolled back as soon as its socket closes. A lease whose connection fails
// is over: Extend (the watchdog's too) reports ErrNotHeld and Lost closes.
// Cancelling the context of an Extend or Release ends the lease as well.
// Once the TTL has run out unrenewed, or the connection failed, the
// connection is dropped, after Lost has closed and at once: the row is
// never free while the holder may still trust its lease.
// Grants are fair: the waiters of a row queue in the server, and MariaDB
// grants a row lock to its waiters first come, first served (since 10.6
// there is no other scheduling; before, FCFS is the default).
//
// It needs MariaDB 10.3 or later (sequences, SET STATEMENT), and the right
// to KILL its own user's connections.
type ForUpdateLocker struct {
	pool             *sql.DB // ours: one connection per lease and per waiter
	ctl              *sql.DB // the service's: a KILL must not queue behind our waiters
	grantSQL, trySQL string
	releaseSQL       string
	done             context.Context // cancelled by Close
	stop             context.CancelFunc
}

// NewForUpdate returns a Locker that opens its own pool with db's DSN,
// keeping WithIdleConns connections between leases: leases pin connections
// for their whole life, and pinning them in the service's pool could starve
// the very holders that need a connection to finish and release. The pool
// has no cap of its own (see WithIdleConns). db itself serves
// the KILLs of cancelled waiters. The table and its sequence are created if
// missing; db must come from gorm.io/driver/mysql opened with a DSN.
func NewForUpdate(db *gorm.DB, opts ...Option) (*ForUpdateLocker, error) {
	c, err := configure(opts, "row_locks")
	if err != nil {
		return nil, err
	}
	d, ok := db.Dialector.(*gormmysql.Dialector)
	if !ok || d.Config == nil || d.DSNConfig == nil {
		return nil, errors.New("mysqllock: NewForUpdate needs a gorm DB opened by gorm.io/driver/mysql from a DSN, to open its own connections")
	}
	ctl, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("mysqllock: %w", err)
	}
	cfg := d.DSNConfig.Clone()
	// One round trip per grant needs multi-statements, which need the
	// parameters interpolated by the driver.
	cfg.MultiStatements, cfg.InterpolateParams = true, true
	// A grant waits on the row lock for as long as its caller's context
	// allows (sessionLimits): a read deadline of the shop's pool would cut
	// it short.
	cfg.ReadTimeout = 0
	if cfg.Params == nil {
		cfg.Params = make(map[string]string)
	}
	maps.Copy(cfg.Params, sessionLimits)
	cfg.Logger = driverLog{}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysqllock: %w", err)
	}
	pool := sql.OpenDB(connector)
	pool.SetMaxIdleConns(c.idleConns)
	pool.SetConnMaxIdleTime(time.Minute)

	ctx, cancel := setupContext(db)
	defer cancel()
	if err := createForUpdate(ctx, pool, c); err != nil {
		_ = pool.Close()
		return nil, err
	}
	grant := c.sql(withoutComments(forUpdateGrant))
	done, stop := context.WithCancel(context.Background())
	return &ForUpdateLocker{
		pool: pool, ctl: ctl, done: done, stop: stop,
		grantSQL: grant, trySQL: strings.Replace(grant, "/*{nowait}*/", noWait, 1),
		releaseSQL: c.sql(forUpdateRelease),
	}, nil
}

// createForUpdate creates the table and the sequence unless both exist.
// It looks first because CREATE SEQUENCE IF NOT EXISTS waits for every open
// transaction that drew from the sequence, that is for every lease held,
// and stalls all new grants behind it meanwhile.
func createForUpdate(ctx context.Context, pool *sql.DB, c config) error {
	var columns sql.NullString
	var sequences int
	err := pool.QueryRowContext(ctx, "SELECT (SELECT GROUP_CONCAT(COLUMN_NAME) FROM information_schema.COLUMNS "+
		"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?), (SELECT COUNT(*) FROM information_schema.TABLES "+
		"WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = ?)", c.table, c.table+"_fence").Scan(&columns, &sequences)
	if err == nil && (!columns.Valid || sequences == 0) {
		_, err = pool.ExecContext(ctx, c.sql(forUpdateSchema))
	}
	if err != nil {
		return fmt.Errorf("mysqllock: create %s and its sequence (MariaDB 10.3+ needed): %w", c.table, unavailable(err))
	}
	if columns.Valid && columns.String != "name" {
		return fmt.Errorf("mysqllock: table %s has columns %s, want only name: it holds nothing but key names, so drop it to have it recreated",
			c.table, columns.String)
	}
	return nil
}

// Capabilities of the row-lock backend: see ForUpdateLocker.
func (l *ForUpdateLocker) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{Fencing: true, WaitNoPoll: true, Fair: true, LostSignal: true, Expires: true, OwnerCheck: true, CrossProcess: true}
}

// Acquire waits on key's row lock until it is granted, ctx ends
// (ctx.Err()), the wait timeout runs out (lockkit.ErrNotAcquired) or the
// Locker closes (lockkit.ErrClosed); in each of the last three cases the
// waiting session is KILLed, so nothing stays queued in the server.
func (l *ForUpdateLocker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, watchdog := backend.Resolve(opts)
	waitCtx, cancel := backend.WaitContext(ctx, o)
	defer cancel()
	stopOnClose := context.AfterFunc(l.done, cancel)
	defer stopOnClose()
	lease, err := l.grant(waitCtx, key, o.TTL, watchdog, l.grantSQL)
	if err != nil && waitCtx.Err() != nil {
		if l.done.Err() != nil {
			return nil, lockkit.ErrClosed
		}
		return nil, backend.WaitErr(ctx, waitCtx)
	}
	return lease, err
}

// TryAcquire makes one attempt and returns lockkit.ErrNotAcquired at once
// if another transaction holds key's row.
func (l *ForUpdateLocker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, watchdog := backend.Resolve(opts)
	return l.grant(ctx, key, o.TTL, watchdog, l.trySQL)
}

func (l *ForUpdateLocker) grant(ctx context.Context, key string, ttl time.Duration, watchdog bool, query string) (lockkit.Lease, error) {
	if l.done.Err() != nil {
		return nil, lockkit.ErrClosed
	}
	if err := checkKey(key); err != nil {
		return nil, err
	}
	ttl = min(ttl, maxWaitTimeout)
	conn, err := l.pool.Conn(ctx)
	if err != nil {
		return nil, unavailable(err)
	}
	sent := time.Now()
	id, fence, err := l.lock(ctx, conn, []byte(key), ttl, query)
	if isCode(err, 1205) && ctx.Err() == nil {
		// TryAcquire on a held row: the session is sound, and its empty
		// transaction is still open.
		if _, rbErr := conn.ExecContext(ctx, "ROLLBACK"); rbErr == nil {
			_ = conn.Close()
			return nil, lockkit.ErrNotAcquired
		}
	}
	if err != nil {
		// Whatever else failed, the session's state is unknown.
		discard(conn)
		return nil, unavailable(err)
	}
	h := &held{conn: conn, gone: make(chan struct{}), kill: func() { l.kill(id) }}
	if time.Since(sent) > ttl/10 {
		// We waited, and the server's idle clock started when the grant
		// was answered, long after sent. Restart it, so that the lease's
		// local deadline is not spent on the wait.
		sent = time.Now()
		if err := h.exec(ctx, false, forUpdateExtend, seconds(ttl)); err != nil {
			return nil, unavailable(err)
		}
	}
	// The lease closes Lost at sent+ttl unless renewed; from then on nobody
	// should hold the row. A timer, not a goroutine: an uncontended grant
	// costs its round trips and nothing else.
	h.mu.Lock()
	defer h.mu.Unlock()
	h.expiry = time.AfterFunc(time.Until(sent.Add(ttl)), h.drop)
	h.lease = backend.NewLease(backend.Grant{
		Key: key, Fence: fence, TTL: ttl, Watchdog: watchdog, Sent: sent, MaxTTL: maxWaitTimeout,
		Extend:  h.extend,
		Release: func(ctx context.Context) error { return h.release(ctx, l.releaseSQL, []byte(key)) },
		Gone:    h.gone,
		Closed:  l.done.Done(),
	})
	return h.lease, nil
}

// lock runs the grant statements on conn and returns its session's id and
// the fence.
func (l *ForUpdateLocker) lock(ctx context.Context, conn *sql.Conn, name []byte, ttl time.Duration, query string) (id, fence uint64, err error) {
	// Given ctx, the driver would answer its end by closing the socket,
	// which the server does not notice while the statement waits for the
	// row. So the statement runs detached, and ctx's end KILLs the
	// session before hanging up.
	stmtCtx, hangUp := context.WithCancel(context.WithoutCancel(ctx))
	defer hangUp()
	// Until the first result set names the session there is nothing to
	// KILL. The server sends it before it queues for the row, so past
	// hangUpWait it is not coming (a server that does not send it would
	// not answer a KILL either): hang up. A session left queued ends at
	// its grant, when its reply finds the connection gone.
	idRead := make(chan struct{})
	stopEarlyHangUp := context.AfterFunc(ctx, func() {
		select {
		case <-idRead: // the KILL below takes over
		case <-time.After(hangUpWait):
			hangUp()
		}
	})
	defer stopEarlyHangUp()
	rows, err := conn.QueryContext(stmtCtx, query, name, name, name, name, seconds(ttl))
	if err != nil {
		return 0, 0, err
	}
	defer rows.Close()
	if !rows.Next() {
		return 0, 0, cmp.Or(rows.Err(), errors.New("mysqllock: no CONNECTION_ID"))
	}
	if err := rows.Scan(&id); err != nil {
		return 0, 0, err
	}
	close(idRead)
	killed, session := make(chan struct{}), id // the KILL may outlive this call and its results
	stopKill := context.AfterFunc(ctx, func() {
		defer close(killed)
		// Hang up once the KILL is through, or after hangUpWait: a server
		// that does not answer the KILL will not answer the waiter either,
		// and the KILL, still on its way, ends the session if it arrives.
		sent := make(chan struct{})
		go func() {
			defer close(sent)
			l.kill(session)
		}()
		select {
		case <-sent:
		case <-time.After(hangUpWait):
		}
		hangUp()
	})
	if rows.NextResultSet() && rows.Next() {
		err = rows.Scan(&fence)
	}
	err = cmp.Or(err, rows.Err(), rows.Close())
	if !stopKill() {
		<-killed // whatever the statement did, the session is gone
		return 0, 0, context.Cause(ctx)
	}
	if err == nil && fence == 0 {
		err = errors.New("mysqllock: grant returned no fence")
	}
	return id, fence, err
}

func (l *ForUpdateLocker) kill(id uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), killTimeout)
	defer cancel()
	// Errors are moot: unknown thread means it is already gone, and if
	// the KILL cannot be sent, hanging up is all that is left.
	_, _ = l.ctl.ExecContext(ctx, fmt.Sprintf("KILL CONNECTION %d", id))
}

// Close stops every lease's watchdog, ends waits with ErrClosed and closes
// the Locker's pool. It releases nothing: a held lease keeps its connection
// until it is released or its TTL, no longer renewed, runs out.
func (l *ForUpdateLocker) Close() error {
	l.stop()
	return l.pool.Close()
}

// driverLog sends the driver's complaints to slog at debug level. On this
// pool they are mostly about sessions ended on purpose (a KILLed waiter, a
// dropped lease), which the driver would print to stderr as errors.
type driverLog struct{}

func (driverLog) Print(v ...any) {
	slog.Debug("mysql driver", "backend", "mysql-forupdate", "msg", fmt.Sprint(v...))
}

// discard closes conn instead of pooling it: its session state is unknown.
func discard(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return badConn })
	_ = conn.Close()
}

// withoutComments drops whole-line comments from a statement that is sent
// as text with every grant: they are for readers of the .sql file.
func withoutComments(query string) string {
	var b strings.Builder
	for line := range strings.Lines(query) {
		if !strings.HasPrefix(line, "--") {
			b.WriteString(line)
		}
	}
	return b.String()
}

// maxWaitTimeout is the largest wait_timeout MariaDB and MySQL keep (a
// larger one is cut to it with a warning): a longer TTL, asked of Acquire
// or Extend, is capped to it, and the lease trusts no more than that.
const maxWaitTimeout = 365 * 24 * time.Hour

// seconds is ttl as a wait_timeout: whole seconds, rounded up, so that the
// server never ends a lease before its holder stops trusting it.
func seconds(ttl time.Duration) int64 {
	return max(1, int64((ttl+time.Second-1)/time.Second))
}
