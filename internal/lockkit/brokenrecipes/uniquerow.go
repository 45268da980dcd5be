package brokenrecipes

import (
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// uniqueRowTable is UniqueRow's lock table: one row per held key, its
// primary key the lock. Nothing in it says when a lock ends.
const uniqueRowTable = `CREATE TABLE IF NOT EXISTS brokenrecipes_locks (
  name  VARBINARY(255) NOT NULL PRIMARY KEY,
  owner VARBINARY(64)  NOT NULL
) ENGINE = InnoDB`

// mysqlDuplicateKey is ER_DUP_ENTRY: the INSERT found the key taken.
const mysqlDuplicateKey = 1062

// UNSAFE: UniqueRow is the database lock most often written first: a
// table whose unique key is the lock name, INSERT to lock (a duplicate-key
// error means someone holds it), DELETE to unlock. The DELETE checks the
// owner; the flaw is that the row has no expiry. A holder that dies
// between the two (a crash, a kill, a lost network) leaves its row, and
// the key stays locked for everyone until an operator deletes it. The
// lease row of lockkit/mysqllock stores an expiry on the database's clock
// and lets a grant take over an expired row.
type UniqueRow struct {
	closer
	db *sql.DB
}

// UNSAFE: NewUniqueRow returns the unique-row recipe over db (MySQL or
// MariaDB), creating its table brokenrecipes_locks if it is missing.
func NewUniqueRow(ctx context.Context, db *sql.DB) (*UniqueRow, error) {
	if _, err := db.ExecContext(ctx, uniqueRowTable); err != nil {
		return nil, fmt.Errorf("brokenrecipes: create lock table: %w", unavailable(err))
	}
	return &UniqueRow{closer: newCloser(), db: db}, nil
}

// UNSAFE: Capabilities declares an owner check and no expiry: a dead
// holder's lock is never freed.
func (u *UniqueRow) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{OwnerCheck: true, CrossProcess: true}
}

// UNSAFE: Acquire polls the INSERT.
func (u *UniqueRow) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return u.poll(ctx, key, opts, u.try)
}

// UNSAFE: TryAcquire makes one INSERT.
func (u *UniqueRow) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return u.tryOnce(ctx, key, opts, u.try)
}

func (u *UniqueRow) try(ctx context.Context, key string, ttl time.Duration, watchdog bool) (lockkit.Lease, error) {
	sent := time.Now()
	owner := rand.Text()
	_, err := u.db.ExecContext(ctx, "INSERT INTO brokenrecipes_locks (name, owner) VALUES (?, ?)", key, owner)
	var myErr *mysql.MySQLError
	switch {
	case errors.As(err, &myErr) && myErr.Number == mysqlDuplicateKey:
		return nil, lockkit.ErrNotAcquired
	case err != nil:
		return nil, unavailable(err)
	}
	// The lease's TTL is the caller's wish; the row ignores it.
	return backend.NewLease(backend.Grant{
		Key: key, TTL: ttl, Watchdog: watchdog, Sent: sent,
		Extend: func(ctx context.Context, _ time.Duration) error {
			var n int
			err := u.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM brokenrecipes_locks WHERE name = ? AND owner = ?", key, owner).Scan(&n)
			return ownerCheckedRows(int64(n), err)
		},
		Release: func(ctx context.Context) error {
			res, err := u.db.ExecContext(ctx, "DELETE FROM brokenrecipes_locks WHERE name = ? AND owner = ?", key, owner)
			if err != nil {
				return unavailable(err)
			}
			n, err := res.RowsAffected()
			return ownerCheckedRows(n, err)
		},
		Closed: u.closed,
	}), nil
}

func ownerCheckedRows(n int64, err error) error {
	switch {
	case err != nil:
		return unavailable(err)
	case n == 0:
		return lockkit.ErrNotHeld
	}
	return nil
}
