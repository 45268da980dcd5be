package main

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/storage"
)

// deps are the clients a backend may be built on; openLocker opens its own
// for the stores nothing else uses.
type deps struct {
	redis redis.UniversalClient // nil unless the backend or strategy needs Redis
	db    *storage.DB
}

// openLocker returns the bare backend cfg.LockBackend names. The caller
// wraps it (reentrancy, metrics) and closes it.
func openLocker(_ context.Context, cfg config.Config, d deps) (lockkit.Locker, error) {
	switch cfg.LockBackend {
	case "none":
		return lockkit.None(), nil
	case "local":
		return local.New(), nil
	case "redis":
		return redislock.New(d.redis, redislock.WithPrefix(cfg.KeyPrefix)), nil
	}
	return nil, fmt.Errorf("lock backend %q is not wired into cmd/shop yet", cfg.LockBackend)
}

// needsRedis reports whether the main Redis client is used.
func needsRedis(cfg config.Config) bool {
	return cfg.LockBackend == "redis" || cfg.StockStrategy == config.StockAtomicRedis
}
