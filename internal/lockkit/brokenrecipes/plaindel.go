package brokenrecipes

import (
	"context"
	"crypto/rand"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// UNSAFE: PlainDel takes a lock correctly, SET key token NX PX ttl,
// and releases it with a plain DEL that does not check the token. A holder
// whose lease ran out during a slow critical section (a GC pause, a slow
// query) then deletes the lock of the client that took the key after it,
// and a third client can take it while the second still believes it holds
// it. The release must compare the token and delete in one script.
type PlainDel struct {
	closer
	rdb redis.UniversalClient
}

// UNSAFE: NewPlainDel returns the unchecked-release recipe over rdb.
func NewPlainDel(rdb redis.UniversalClient) *PlainDel {
	return &PlainDel{closer: newCloser(), rdb: rdb}
}

// UNSAFE: Capabilities declares that release and extend check no owner.
func (p *PlainDel) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{LostSignal: true, Expires: true, CrossProcess: true}
}

// UNSAFE: Acquire polls SET NX PX.
func (p *PlainDel) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return p.poll(ctx, key, opts, p.try)
}

// UNSAFE: TryAcquire makes one SET NX PX.
func (p *PlainDel) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return p.tryOnce(ctx, key, opts, p.try)
}

func (p *PlainDel) try(ctx context.Context, key string, ttl time.Duration, watchdog bool) (lockkit.Lease, error) {
	sent := time.Now()
	ok, err := p.rdb.SetNX(ctx, key, rand.Text(), ttl).Result()
	if err != nil {
		return nil, unavailable(err)
	}
	if !ok {
		return nil, lockkit.ErrNotAcquired
	}
	return backend.NewLease(backend.Grant{
		Key: key, TTL: ttl, Watchdog: watchdog, Sent: sent,
		// The flaw, twice: whoever holds the key now is extended, or freed.
		Extend: func(ctx context.Context, ttl time.Duration) error {
			ok, err := p.rdb.PExpire(ctx, key, ttl).Result()
			if err != nil {
				return unavailable(err)
			}
			if !ok {
				return lockkit.ErrNotHeld
			}
			return nil
		},
		Release: func(ctx context.Context) error {
			if err := p.rdb.Del(ctx, key).Err(); err != nil {
				return unavailable(err)
			}
			return nil
		},
		Closed: p.closed,
	}), nil
}
