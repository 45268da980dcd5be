package brokenrecipes

import (
	"context"
	"crypto/rand"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// UNSAFE: SetNXExpire takes a lock with SETNX and gives it a TTL with a
// second command, EXPIRE, as many early Redis lock recipes did. A client
// that crashes, is killed or loses its connection between the two leaves a
// lock without a TTL: nobody ever gets that key again until an operator
// deletes it. SET key value NX PX ttl does both in one command.
type SetNXExpire struct {
	closer
	rdb redis.UniversalClient
	// afterSetNX, if set, runs between the two commands: the tests crash
	// the "process" there.
	afterSetNX func()
}

// UNSAFE: NewSetNXExpire returns the two-step recipe over rdb.
func NewSetNXExpire(rdb redis.UniversalClient) *SetNXExpire {
	return &SetNXExpire{closer: newCloser(), rdb: rdb}
}

// UNSAFE: Capabilities declares that a lock may never expire.
func (s *SetNXExpire) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{LostSignal: true, OwnerCheck: true, CrossProcess: true}
}

// UNSAFE: Acquire polls the two-step acquire.
func (s *SetNXExpire) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return s.poll(ctx, key, opts, s.try)
}

// UNSAFE: TryAcquire makes one two-step attempt.
func (s *SetNXExpire) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return s.tryOnce(ctx, key, opts, s.try)
}

func (s *SetNXExpire) try(ctx context.Context, key string, ttl time.Duration, watchdog bool) (lockkit.Lease, error) {
	token := rand.Text()
	ok, err := s.rdb.SetNX(ctx, key, token, 0).Result()
	if err != nil {
		return nil, unavailable(err)
	}
	if !ok {
		return nil, lockkit.ErrNotAcquired
	}
	// The flaw: from here until EXPIRE is applied, the key has no TTL.
	if s.afterSetNX != nil {
		s.afterSetNX()
	}
	sent := time.Now()
	if err := s.rdb.PExpire(ctx, key, ttl).Err(); err != nil {
		return nil, unavailable(err)
	}
	return backend.NewLease(backend.Grant{
		Key: key, TTL: ttl, Watchdog: watchdog, Sent: sent,
		Extend: func(ctx context.Context, ttl time.Duration) error {
			return ownerChecked(extendScript.Run(ctx, s.rdb, []string{key}, token, ttl.Milliseconds()))
		},
		Release: func(ctx context.Context) error {
			return ownerChecked(releaseScript.Run(ctx, s.rdb, []string{key}, token))
		},
		Closed: s.closed,
	}), nil
}

func ownerChecked(cmd *redis.Cmd) error {
	n, err := cmd.Int()
	switch {
	case err != nil:
		return unavailable(err)
	case n == 0:
		return lockkit.ErrNotHeld
	}
	return nil
}
