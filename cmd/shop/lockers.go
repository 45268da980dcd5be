package main

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/registry"
	"github.com/lockbench/shop/internal/storage"
)

// deps are the clients a backend may be built on; the registry opens its
// own for the stores nothing else uses.
type deps struct {
	redis redis.UniversalClient // shop's Redis: likes and idempotency tokens live there whatever the backend
	// lockRedis is the Redis of SHOP_LOCK_REDIS_ADDRS; nil: backend redis
	// locks on redis.
	lockRedis redis.UniversalClient
	db        *storage.DB
}

// openLocker returns the bare backend cfg.LockBackend names, its keys under
// cfg.KeyPrefix. The caller wraps it (admission, metrics, tracing) and closes it;
// Close also closes the clients the registry opened for it.
func openLocker(ctx context.Context, cfg config.Config, d deps) (lockkit.Locker, error) {
	s := registry.Settings{
		KeyPrefix:      cfg.KeyPrefix,
		Redis:          d.redis,
		RedlockAddrs:   cfg.RedlockAddrs,
		ZKAddrs:        cfg.ZKAddrs,
		EtcdEndpoints:  cfg.EtcdEndpoints,
		MemcachedAddrs: cfg.MemcachedAddrs,
	}
	if d.lockRedis != nil {
		s.Redis = d.lockRedis
	}
	if d.db != nil {
		s.DB = d.db.DB
	}
	return registry.Open(ctx, cfg.LockBackend, s)
}
