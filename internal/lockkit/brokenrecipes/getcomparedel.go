package brokenrecipes

import (
	"context"
	"crypto/rand"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// UNSAFE: GetCompareDel takes a lock correctly, SET key token NX PX ttl,
// and releases it owner-checked, but in two commands: GET the value,
// compare it with its token in the client, then DEL. The key can expire
// between the GET and the DEL (a pause, a slow network) and be taken by
// another client; the DEL then frees that client's lock, and a third
// client takes the key while the second still holds it. The owner check
// and the delete must run as one script (release.lua).
type GetCompareDel struct {
	closer
	rdb redis.UniversalClient
	// afterCompare, if set, runs once the GET has matched the token and
	// before the DEL: the tests pause the releasing client there.
	afterCompare func()
}

// UNSAFE: NewGetCompareDel returns the two-command release recipe over rdb.
func NewGetCompareDel(rdb redis.UniversalClient) *GetCompareDel {
	return &GetCompareDel{closer: newCloser(), rdb: rdb}
}

// UNSAFE: Capabilities declares an owner check, which holds only while
// nothing runs between its two commands.
func (g *GetCompareDel) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{LostSignal: true, Expires: true, OwnerCheck: true, CrossProcess: true}
}

// UNSAFE: Acquire polls SET NX PX.
func (g *GetCompareDel) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return g.poll(ctx, key, opts, g.try)
}

// UNSAFE: TryAcquire makes one SET NX PX.
func (g *GetCompareDel) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return g.tryOnce(ctx, key, opts, g.try)
}

func (g *GetCompareDel) try(ctx context.Context, key string, ttl time.Duration, watchdog bool) (lockkit.Lease, error) {
	sent := time.Now()
	token := rand.Text()
	ok, err := g.rdb.SetNX(ctx, key, token, ttl).Result()
	if err != nil {
		return nil, unavailable(err)
	}
	if !ok {
		return nil, lockkit.ErrNotAcquired
	}
	return backend.NewLease(backend.Grant{
		Key: key, TTL: ttl, Watchdog: watchdog, Sent: sent,
		Extend: func(ctx context.Context, ttl time.Duration) error {
			return ownerChecked(extendScript.Run(ctx, g.rdb, []string{key}, token, ttl.Milliseconds()))
		},
		Release: func(ctx context.Context) error {
			held, err := g.rdb.Get(ctx, key).Result()
			switch {
			case errors.Is(err, redis.Nil):
				return lockkit.ErrNotHeld
			case err != nil:
				return unavailable(err)
			case held != token:
				return lockkit.ErrNotHeld
			}
			// The flaw: the key was ours at the GET; nothing says it
			// still is at the DEL.
			if g.afterCompare != nil {
				g.afterCompare()
			}
			if err := g.rdb.Del(ctx, key).Err(); err != nil {
				return unavailable(err)
			}
			return nil
		},
		Closed: g.closed,
	}), nil
}
