package mysqllock

import (
	"context"
	"crypto/rand"
	"database/sql"
	_ "embed"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

var (
	//go:embed lease_schema.sql
	leaseSchema string
	//go:embed lease_grant.sql
	leaseGrant string
)

// The owner check and the expiry check sit in the WHERE clause, so a
// release or extend by anyone but the current, unexpired owner matches no
// row and changes nothing.
const (
	leaseExtend = "UPDATE {table} SET expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND " +
		"WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
	leaseRelease = "UPDATE {table} SET owner = NULL, expires_at = NULL " +
		"WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
	leaseHeld = "SELECT COUNT(*) FROM {table} WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)"
)

// abandonTimeout bounds each attempt to release a grant whose reply was
// lost; giveBackDelay paces the attempts.
const (
	abandonTimeout = 2 * time.Second
	giveBackDelay  = 100 * time.Millisecond
)

// Locker is the "mysql" backend: one lease row per key, granted by a single
// conditional upsert and timed on the database's clock.
//
// It fences (the row's counter rises with every grant and survives
// releases; a row deleted and created again starts above every earlier
// token, see lease_grant.sql), checks the owner on release and extend, and expires leases on
// its own. It does not wait without polling: a lease row holds no lock a
// waiter could block on. The waiters of one Locker for one key stand in
// line (backend.Line) and only the first polls, with jittered exponential
// backoff (WithPoll): the row sees one grant statement per process, not
// one per waiter. A release through the same Locker makes the first try
// at once, and a waiter whose turn came with a grant to the one ahead
// does not ask until that lease is released or lost. It learns that its
// lease was taken only when the watchdog next renews it, within a third of
// the TTL. Grants are not fair: in arrival order within a Locker, in no
// order between Lockers; a Locker whose line never empties lets the key go
// for the longest poll every backend.HandOffRun hand-offs, so that the
// waiters of other processes are served.
type Locker struct {
	grant, extend, release, held *sql.Stmt
	minPoll, maxPoll             time.Duration
	line                         backend.Line
	once                         sync.Once
	// background runs the give-backs Close waits for; its Done is the
	// Locker's shutdown signal.
	background backend.Group
}

// New returns a lease-row Locker over db's pool, creating the table if it
// is missing (under db's context if it carries one). Statements are
// prepared once; Close releases them but leaves db open.
func New(db *gorm.DB, opts ...Option) (*Locker, error) {
	c, err := configure(opts, "locks")
	if err != nil {
		return nil, err
	}
	ctx, cancel := setupContext(db)
	defer cancel()
	if err := db.WithContext(ctx).Exec(c.sql(leaseSchema)).Error; err != nil {
		return nil, fmt.Errorf("mysqllock: create table %s: %w", c.table, unavailable(err))
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("mysqllock: %w", err)
	}
	l := &Locker{minPoll: c.minPoll, maxPoll: c.maxPoll}
	// gorm's Exec cannot report LAST_INSERT_ID, and prepared statements
	// make every grant one round trip instead of prepare+execute+close.
	// Preparing also checks that an existing table has the columns we use.
	for _, s := range []struct {
		stmt **sql.Stmt
		sql  string
	}{{&l.grant, leaseGrant}, {&l.extend, leaseExtend}, {&l.release, leaseRelease}, {&l.held, leaseHeld}} {
		if *s.stmt, err = sqlDB.PrepareContext(ctx, c.sql(s.sql)); err != nil {
			_ = l.Close()
			return nil, fmt.Errorf("mysqllock: table %s: %w", c.table, unavailable(err))
		}
	}
	return l, nil
}

// Capabilities of the lease-row backend: see Locker.
func (l *Locker) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{Fencing: true, LostSignal: true, Expires: true, OwnerCheck: true, CrossProcess: true}
}

// Acquire waits for key, polling as the Locker's doc says, until it is
// granted, ctx ends (ctx.Err()), the wait timeout runs out
// (lockkit.ErrNotAcquired) or the Locker closes (lockkit.ErrClosed).
func (l *Locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, watchdog := backend.Resolve(opts)
	poller := backend.Poller{
		MinDelay: l.minPoll, MaxDelay: l.maxPoll, Backoff: true,
		// A second failure to reach the server ends the wait: one cut
		// connection (a KILL, a proxy's idle-out) is not an outage, and a
		// head's verdict ends the wait of its whole line.
		Outage: 2,
		Closed: l.background.Done(),
		Line:   &l.line, Key: key,
	}
	return poller.Acquire(ctx, o, func(tryCtx context.Context) (lockkit.Lease, error) {
		return l.try(tryCtx, key, o.TTL, watchdog)
	})
}

// TryAcquire makes one attempt, one round trip, and returns
// lockkit.ErrNotAcquired if the key is held and unexpired.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, watchdog := backend.Resolve(opts)
	return l.try(ctx, key, o.TTL, watchdog)
}

func (l *Locker) try(ctx context.Context, key string, ttl time.Duration, watchdog bool) (lockkit.Lease, error) {
	select {
	case <-l.background.Done():
		return nil, lockkit.ErrClosed
	default:
	}
	if err := checkKey(key); err != nil {
		return nil, err
	}
	name, owner := []byte(key), []byte(rand.Text())
	sent := time.Now()
	res, err := l.grant.ExecContext(ctx, name, owner, ttl.Microseconds())
	var fence int64
	if err == nil {
		fence, err = res.LastInsertId()
	}
	if err != nil {
		var myErr *mysql.MySQLError
		if !errors.As(err, &myErr) {
			// Not refused by the server: the upsert may have reached it and
			// granted the key to an owner nobody will ever use (the reply
			// was lost, or ctx ended first). Free it rather than leave it
			// blocking others for a whole TTL.
			l.giveBack(name, owner, ttl)
		}
		return nil, unavailable(err)
	}
	if fence == 0 {
		return nil, lockkit.ErrNotAcquired
	}
	return backend.NewLease(backend.Grant{
		Key: key, Fence: uint64(fence), TTL: ttl, Watchdog: watchdog, Sent: sent,
		Extend:  func(ctx context.Context, ttl time.Duration) error { return l.extendLease(ctx, name, owner, ttl) },
		Release: func(ctx context.Context) error { return l.releaseLease(ctx, name, owner) },
		Closed:  l.background.Done(),
	}), nil
}

// giveBack releases, in the background, a grant that may have been made to
// owner. The release is owner-checked, so it is harmless if there was
// none; it is retried while the server is unreachable, until the grant
// would have expired anyway or the Locker closes.
func (l *Locker) giveBack(name, owner []byte, ttl time.Duration) {
	// Refused once Close began: its statements are closed, and the grant
	// expires by its TTL.
	l.background.Go(func() {
		expired := time.NewTimer(ttl)
		defer expired.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), abandonTimeout)
			err := l.releaseLease(ctx, name, owner)
			cancel()
			if err == nil || errors.Is(err, lockkit.ErrNotHeld) {
				return
			}
			select {
			case <-expired.C:
				return
			case <-l.background.Done():
				return
			case <-time.After(giveBackDelay):
			}
		}
	})
}

func (l *Locker) extendLease(ctx context.Context, name, owner []byte, ttl time.Duration) error {
	res, err := l.extend.ExecContext(ctx, ttl.Microseconds(), name, owner)
	if err != nil {
		return unavailable(err)
	}
	if n, _ := res.RowsAffected(); n == 1 {
		return nil
	}
	// Zero rows changed can also mean "matched, but the new expiry equals
	// the old one" (same microsecond, same TTL) when the DSN lacks
	// clientFoundRows; ask rather than give up a lease we still hold.
	var held int
	if err := l.held.QueryRowContext(ctx, name, owner).Scan(&held); err != nil {
		return unavailable(err)
	}
	if held == 0 {
		return lockkit.ErrNotHeld
	}
	return nil
}

func (l *Locker) releaseLease(ctx context.Context, name, owner []byte) error {
	res, err := l.release.ExecContext(ctx, name, owner)
	if err != nil {
		return unavailable(err)
	}
	// The UPDATE sets owner from ours to NULL, so a matched row is always
	// a changed row and RowsAffected is exact.
	if n, _ := res.RowsAffected(); n == 0 {
		return lockkit.ErrNotHeld
	}
	l.line.Released(string(name))
	return nil
}

// Close stops every lease's watchdog and wakes waiters with ErrClosed. It
// releases nothing (leases expire by their TTL) and leaves the pool open.
func (l *Locker) Close() error {
	l.once.Do(func() {
		l.background.Stop()
		l.background.Wait()
		for _, s := range []*sql.Stmt{l.grant, l.extend, l.release, l.held} {
			if s != nil {
				_ = s.Close()
			}
		}
	})
	return nil
}
