package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/etcdlock"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/lockkit/memcachedlock"
	"github.com/lockbench/shop/internal/lockkit/mysqllock"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/lockkit/redlock"
	"github.com/lockbench/shop/internal/lockkit/zklock"
	"github.com/lockbench/shop/internal/storage"
)

// Session lengths of the session-based backends: how long a crashed
// holder's lock outlives it. Short enough that a crash heals in seconds,
// long enough that a GC pause or a busy loopback does not end a session.
const (
	zkSessionTimeout = 6 * time.Second
	etcdSessionTTL   = 6 * time.Second
)

// deps are the clients a backend may be built on; openLocker opens its own
// for the stores nothing else uses.
type deps struct {
	redis redis.UniversalClient // nil unless the backend or strategy needs Redis
	db    *storage.DB
}

// openLocker returns the bare backend cfg.LockBackend names. The caller
// wraps it (reentrancy, metrics) and closes it; Close also closes the
// clients openLocker opened for it.
func openLocker(_ context.Context, cfg config.Config, d deps) (lockkit.Locker, error) {
	switch cfg.LockBackend {
	case "none":
		return lockkit.None(), nil
	case "local":
		return local.New(), nil
	case "redis":
		return redislock.New(d.redis, redislock.WithPrefix(cfg.KeyPrefix)), nil
	case "redlock":
		clients := make([]redis.UniversalClient, len(cfg.RedlockAddrs))
		var closers []func() error
		for i, addr := range cfg.RedlockAddrs {
			// One silent master must cost one attempt's timeout, not
			// go-redis's dial retries and its 3 s read timeout.
			c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
			clients[i] = c
			closers = append(closers, c.Close)
		}
		return withClosers(lockkit.WithKeyPrefix(redlock.New(clients), cfg.KeyPrefix), closers...), nil
	case "mysql", "mysql-forupdate":
		if d.db.Dialect != "mysql" {
			return nil, fmt.Errorf("lock backend %s needs SHOP_MYSQL_DSN (the embedded SQLite cannot hold its locks)", cfg.LockBackend)
		}
		if cfg.LockBackend == "mysql" {
			return mysqllock.New(d.db.DB)
		}
		return mysqllock.NewForUpdate(d.db.DB)
	case "zookeeper":
		return zklock.New(cfg.ZKAddrs, zkSessionTimeout, zklock.WithRoot("/shop/locks"+prefixPath(cfg.KeyPrefix)))
	case "etcd":
		return etcdlock.New(cfg.EtcdEndpoints, etcdlock.WithSessionTTL(etcdSessionTTL), etcdlock.WithPrefix("/shop/locks/"+cfg.KeyPrefix))
	case "memcached":
		return lockkit.WithKeyPrefix(memcachedlock.New(memcache.New(cfg.MemcachedAddrs...)), cfg.KeyPrefix), nil
	}
	return nil, fmt.Errorf("unknown lock backend %q", cfg.LockBackend)
}

func prefixPath(prefix string) string {
	if prefix == "" {
		return ""
	}
	return "/" + prefix
}

// needsRedis reports whether the main Redis client is used: always, since
// likes and idempotency tokens live in Redis whatever the lock backend.
func needsRedis(config.Config) bool { return true }

// closingLocker closes the clients a backend was built on with it.
type closingLocker struct {
	lockkit.Locker
	closers []func() error
}

func withClosers(l lockkit.Locker, closers ...func() error) lockkit.Locker {
	return closingLocker{l, closers}
}

func (c closingLocker) Close() error {
	errs := []error{c.Locker.Close()}
	for _, close := range c.closers {
		errs = append(errs, close())
	}
	return errors.Join(errs...)
}

// Capabilities passes the backend's declaration through the wrapper.
func (c closingLocker) Capabilities() lockkit.Capabilities {
	return lockkit.CapabilitiesOf(c.Locker)
}
