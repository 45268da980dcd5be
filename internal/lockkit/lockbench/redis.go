package lockbench

import (
	"context"
	"time"

	bsm "github.com/bsm/redislock"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

// RedisSubject is one Redis lock whose uncontended cycle is counted in
// instructions: on the server (BenchmarkRedisInstructions) and in the
// client (the rediscycles program), both running this same cycle.
type RedisSubject struct {
	Name string
	// Open returns one acquire + release of key on c, and what to close
	// once the cycles are done.
	Open func(c *redis.Client) (cycle func(ctx context.Context, key string) error, closer func() error, err error)
}

// RedisSubjects are shop's Redis grants beside the peer libraries.
func RedisSubjects() []RedisSubject {
	return []RedisSubject{
		{"shop-redis", openShop()},
		{"shop-redis-unfenced", openShop(lockkit.WithoutFence())},
		{"bsm-redislock", openBSM},
		{"redsync", openRedsync},
	}
}

func openShop(opts ...lockkit.Option) func(*redis.Client) (func(context.Context, string) error, func() error, error) {
	opts = append([]lockkit.Option{lockkit.WithTTL(10 * time.Second)}, opts...)
	return func(c *redis.Client) (func(context.Context, string) error, func() error, error) {
		l, err := redislock.New(c, redislock.WithPrefix("instr:"))
		if err != nil {
			return nil, nil, err
		}
		return func(ctx context.Context, key string) error {
			lease, err := l.Acquire(ctx, key, opts...)
			if err != nil {
				return err
			}
			return lease.Release(ctx)
		}, l.Close, nil
	}
}

func openBSM(c *redis.Client) (func(context.Context, string) error, func() error, error) {
	client := bsm.New(c)
	return func(ctx context.Context, key string) error {
		lock, err := client.Obtain(ctx, "instr:bsm:"+key, 10*time.Second, nil)
		if err != nil {
			return err
		}
		return lock.Release(ctx)
	}, func() error { return nil }, nil
}

func openRedsync(c *redis.Client) (func(context.Context, string) error, func() error, error) {
	rs := redsync.New(goredis.NewPool(c))
	return func(ctx context.Context, key string) error {
		m := rs.NewMutex("instr:redsync:"+key, redsync.WithExpiry(10*time.Second))
		if err := m.LockContext(ctx); err != nil {
			return err
		}
		_, err := m.UnlockContext(ctx)
		return err
	}, func() error { return nil }, nil
}
