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
//
// It does close the race DelSetNX leaves open: of two clients that read
// the same stale value, only one gets the lock.
type GetSetTimestamp struct{ stamped }

// UNSAFE: NewGetSetTimestamp returns the GETSET-timestamp recipe over
// rdb, on the local clock.
func NewGetSetTimestamp(rdb redis.UniversalClient) *GetSetTimestamp {
	g := &GetSetTimestamp{stamped{closer: newCloser(), rdb: rdb, now: time.Now}}
	g.recover = g.getSet
	return g
}

// getSet recovers a stale lock with one GETSET: whoever reads back a stale
// value was first.
func (g *GetSetTimestamp) getSet(ctx context.Context, key string, mine, now int64) error {
	old, err := g.rdb.GetSet(ctx, key, mine).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return unavailable(err)
	}
	if old >= now {
		// The flaw: we lost, but our GETSET has already replaced the
		// winner's expiry with ours.
		return lockkit.ErrNotAcquired
	}
	return nil
}

// stamped is what the recipes whose value is an expiry timestamp share:
// SETNX, GET and the stale check, the lease, and the clock. Only how a
// stale lock is recovered differs.
type stamped struct {
	closer
	rdb redis.UniversalClient
	// now is this client's clock; the tests skew it.
	now func() time.Time
	// afterGet, if set, runs after a GET found the lock stale and before
	// the recovery: the tests let two clients read the same stale value
	// there.
	afterGet func()
	// recover takes over a lock found stale, storing mine (this client's
	// expiry); ErrNotAcquired when another client was faster.
	recover func(ctx context.Context, key string, mine, now int64) error
}

// UNSAFE: Capabilities declares no owner check (the value is a
// timestamp, not an owner) and leans on clocks agreeing for expiry.
func (s *stamped) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{Expires: true, CrossProcess: true}
}

// UNSAFE: Acquire polls the recipe.
func (s *stamped) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return s.poll(ctx, key, opts, s.try)
}

// UNSAFE: TryAcquire runs the recipe once.
func (s *stamped) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return s.tryOnce(ctx, key, opts, s.try)
}

func (s *stamped) try(ctx context.Context, key string, ttl time.Duration, watchdog bool) (lockkit.Lease, error) {
	sent := time.Now()
	now := s.now().UnixMilli()
	mine := now + ttl.Milliseconds()
	ok, err := s.rdb.SetNX(ctx, key, mine, 0).Result()
	if err != nil {
		return nil, unavailable(err)
	}
	if !ok {
		held, err := s.rdb.Get(ctx, key).Int64()
		switch {
		case errors.Is(err, redis.Nil):
			return nil, lockkit.ErrNotAcquired // released meanwhile: start over
		case err != nil:
			return nil, unavailable(err)
		case held >= now:
			return nil, lockkit.ErrNotAcquired
		}
		if s.afterGet != nil {
			s.afterGet()
		}
		if err := s.recover(ctx, key, mine, now); err != nil {
			return nil, err
		}
	}

	var mu sync.Mutex // guards expires: the watchdog and the caller may both extend
	expires := mine
	return backend.NewLease(backend.Grant{
		Key: key, TTL: ttl, Watchdog: watchdog, Sent: sent,
		Extend: func(ctx context.Context, ttl time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			now := s.now().UnixMilli()
			if now >= expires {
				return lockkit.ErrNotHeld
			}
			if err := s.rdb.Set(ctx, key, now+ttl.Milliseconds(), 0).Err(); err != nil {
				return unavailable(err)
			}
			expires = now + ttl.Milliseconds()
			return nil
		},
		Release: func(ctx context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			if s.now().UnixMilli() >= expires {
				return lockkit.ErrNotHeld // as the documentation says: past your expiry, do not DEL
			}
			if err := s.rdb.Del(ctx, key).Err(); err != nil {
				return unavailable(err)
			}
			return nil
		},
		Closed: s.closed,
	}), nil
}
