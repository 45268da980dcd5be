package brokenrecipes

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
)

// UNSAFE: DelSetNX is the timestamp lock of GetSetTimestamp with the
// recovery the old SETNX documentation warns against: a client that finds
// the stored expiry past deletes the key and takes it again,
//
//	GET key                             past: stale
//	DEL key
//	SETNX key <now+ttl>                 1: acquired
//
// Two waiters that both read the same stale value both win: the first
// DELs and SETNXes, and the second's DEL then deletes the first one's
// fresh lock, so its SETNX succeeds too. GETSET (GetSetTimestamp) makes
// the recovery one command and lets only one of them in.
type DelSetNX struct{ stamped }

// UNSAFE: NewDelSetNX returns the DEL + SETNX recovery recipe over rdb, on
// the local clock.
func NewDelSetNX(rdb redis.UniversalClient) *DelSetNX {
	d := &DelSetNX{stamped{closer: newCloser(), rdb: rdb, now: time.Now}}
	d.recover = d.delSetNX
	return d
}

func (d *DelSetNX) delSetNX(ctx context.Context, key string, mine, _ int64) error {
	// The flaw: the DEL does not check that the value is still the stale
	// one this client read.
	if err := d.rdb.Del(ctx, key).Err(); err != nil {
		return unavailable(err)
	}
	ok, err := d.rdb.SetNX(ctx, key, mine, 0).Result()
	if err != nil {
		return unavailable(err)
	}
	if !ok {
		return lockkit.ErrNotAcquired
	}
	return nil
}
