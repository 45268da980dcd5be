package brokenrecipes

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// UNSAFE: GetSetTimestamp is the lock of the old Redis SETNX
// documentation ("Handling deadlocks"), with milliseconds for seconds. The
// value is the holder's expiry time on its own clock and the key has no TTL:
//
//	SETNX key <now+ttl>                 1: acquired
//	GET key                             not yet past: held, retry later
//	GETSET key <now+ttl>                old value past: acquired
//	                                    old value not past: someone was faster
//
// Release is "check that your own expiry has not passed, then DEL".
//
// It fails in two ways. Two clients that both GET the same stale value both
// GETSET: the first wins, and the second, which "only" overwrote the value
// (the documentation calls that "not a problem"), has replaced the winner's
// expiry with its own. If that is earlier, a third client recovers the lock
// while the winner holds it. And expiry is judged on each client's clock: a
// client whose clock runs ahead by more than the TTL recovers live locks.
type GetSetTimestamp struct {
	closer
	rdb redis.UniversalClient
	// now is this client's clock; the tests skew it.
	now func() time.Time
	// afterGet, if set, runs after a GET found the lock stale and before
	// the GETSET: the tests let two clients read the same stale value there.
	afterGet func()
}

// UNSAFE: NewGetSetTimestamp returns the GETSET-timestamp recipe over
// rdb, on the local clock.
func NewGetSetTimestamp(rdb redis.UniversalClient) *GetSetTimestamp {
	return &GetSetTimestamp{closer: newCloser(), rdb: rdb, now: time.Now}
}

// UNSAFE: Capabilities declares no owner check (the value is a
// timestamp, not an owner) and leans on clocks agreeing for expiry.
func (g *GetSetTimestamp) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{Expires: true, CrossProcess: true}
}

// UNSAFE: Acquire polls the recipe.
func (g *GetSetTimestamp) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return g.poll(ctx, key, opts, g.try)
}

// UNSAFE: TryAcquire runs the recipe once.
func (g *GetSetTimestamp) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return g.tryOnce(ctx, key, opts, g.try)
}

func (g *GetSetTimestamp) try(ctx context.Context, key string, ttl time.Duration, watchdog bool) (lockkit.Lease, error) {
	sent := time.Now()
	now := g.now().UnixMilli()
	mine := now + ttl.Milliseconds()
	ok, err := g.rdb.SetNX(ctx, key, mine, 0).Result()
	if err != nil {
		return nil, unavailable(err)
	}
	if !ok {
		held, err := g.rdb.Get(ctx, key).Int64()
		switch {
		case errors.Is(err, redis.Nil):
			return nil, lockkit.ErrNotAcquired // released meanwhile: start over
		case err != nil:
			return nil, unavailable(err)
		case held >= now:
			return nil, lockkit.ErrNotAcquired
		}
		if g.afterGet != nil {
			g.afterGet()
		}
		old, err := g.rdb.GetSet(ctx, key, mine).Int64()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, unavailable(err)
		}
		if old >= now {
			// The flaw: we lost, but our GETSET has already replaced
			// the winner's expiry with ours.
			return nil, lockkit.ErrNotAcquired
		}
	}

	var mu sync.Mutex // guards expires: the watchdog and the caller may both extend
	expires := mine
	return backend.NewLease(backend.Grant{
		Key: key, TTL: ttl, Watchdog: watchdog, Sent: sent,
		Extend: func(ctx context.Context, ttl time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			now := g.now().UnixMilli()
			if now >= expires {
				return lockkit.ErrNotHeld
			}
			if err := g.rdb.Set(ctx, key, now+ttl.Milliseconds(), 0).Err(); err != nil {
				return unavailable(err)
			}
			expires = now + ttl.Milliseconds()
			return nil
		},
		Release: func(ctx context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			if g.now().UnixMilli() >= expires {
				return lockkit.ErrNotHeld // as the documentation says: past your expiry, do not DEL
			}
			if err := g.rdb.Del(ctx, key).Err(); err != nil {
				return unavailable(err)
			}
			return nil
		},
		Closed: g.closed,
	}), nil
}
