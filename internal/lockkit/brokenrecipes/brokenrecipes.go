// Package brokenrecipes holds the lock recipes that the literature warns
// about, each as a lockkit.Locker, so that tests and load tests can run them
// under the same code as the real backends and show how each one breaks:
//
//   - SetNXExpire takes the lock with SETNX, then sets its TTL with EXPIRE:
//     a crash between the two leaves a lock that never expires.
//   - PlainDel sets the lock atomically (SET NX PX) but releases it with a
//     plain DEL: a holder that outlived its TTL frees its successor's lock.
//   - GetCompareDel releases with GET, a compare in the client, then DEL:
//     a key that expires between the two frees its next holder's lock.
//   - GetSetTimestamp is the recipe of the old SETNX documentation: the
//     value is an expiry timestamp, and a stale lock is recovered with
//     GETSET. A loser's GETSET overwrites the winner's expiry, and clients
//     whose clocks disagree recover each other's live locks.
//   - DelSetNX is the same timestamp lock recovered with DEL, then SETNX:
//     two waiters that read the same stale value both win.
//   - UniqueRow is a MariaDB table whose unique key is the lock, INSERT to
//     lock and DELETE to unlock: a holder that dies locks the key for ever.
//   - ParentWatch is ZooKeeper's queue of sequential nodes with every
//     waiter watching the lock's directory: each release wakes them all
//     (the herd effect). It excludes; it costs the server a listing per
//     waiter per change.
//
// CountThenInsert is no lock but what a lock was guarding: a per-user
// purchase limit that counts the user's purchases, then inserts one; two
// purchases that count at once both pass the limit.
//
// Each recipe has exactly its known flaw and is otherwise written as it is
// usually found. The tests inject the crash or the pause at the exact step
// through hook fields, so every failure is reproduced deterministically.
//
// The tests run each failure beside the recipe that survives the same
// interleaving (the one-script release, GETSET, the lease row, one
// conditional UPDATE), and show
// that a row held SELECT … FOR UPDATE stops writers but not a plain SELECT.
//
// UNSAFE: use none of them to protect anything; lockkit/redislock and
// lockkit/mysqllock are the safe locks.
package brokenrecipes

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

var (
	//go:embed release.lua
	releaseLua    string
	releaseScript = redis.NewScript(releaseLua)
	//go:embed extend.lua
	extendLua    string
	extendScript = redis.NewScript(extendLua)
)

// retryDelay is the mean pause between two attempts of a waiting Acquire;
// the recipes all poll.
const retryDelay = 20 * time.Millisecond

// closer is the shutdown signal every recipe shares with its leases.
type closer struct {
	closed chan struct{}
	once   sync.Once
}

func newCloser() closer { return closer{closed: make(chan struct{})} }

// UNSAFE: Close stops the recipe's watchdogs; waiters get
// lockkit.ErrClosed. Locks still held stay in Redis.
func (c *closer) Close() error {
	c.once.Do(func() { close(c.closed) })
	return nil
}

// attempt is one try of a recipe at key.
type attempt func(ctx context.Context, key string, ttl time.Duration, watchdog bool) (lockkit.Lease, error)

// tryOnce is TryAcquire for every recipe.
func (c *closer) tryOnce(ctx context.Context, key string, opts []lockkit.Option, try attempt) (lockkit.Lease, error) {
	select {
	case <-c.closed:
		return nil, lockkit.ErrClosed
	default:
	}
	o, watchdog := backend.Resolve(opts)
	return try(ctx, key, o.TTL, watchdog)
}

// poll is Acquire for every recipe: try with jittered pauses until granted,
// or the wait ends.
func (c *closer) poll(ctx context.Context, key string, opts []lockkit.Option, try attempt) (lockkit.Lease, error) {
	o, _ := backend.Resolve(opts)
	poller := backend.Poller{MinDelay: retryDelay / 2, MaxDelay: retryDelay*3/2 - 1, Outage: 1, Closed: c.closed}
	return poller.Acquire(ctx, o, func(context.Context) (lockkit.Lease, error) { return c.tryOnce(ctx, key, opts, try) })
}

func unavailable(err error) error { return fmt.Errorf("%w: %w", lockkit.ErrUnavailable, err) }
