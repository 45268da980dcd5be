package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/config"
)

// openLockRedis opens the Redis backend redis keeps its lock keys and
// fence counters on when SHOP_LOCK_REDIS_ADDRS names one (a.lockRedis;
// nil: the main Redis, main, holds them), and checks that server's
// settings. Other backends never touch it.
func (a *app) openLockRedis(ctx context.Context, cfg config.Config, main redis.UniversalClient, log *slog.Logger) error {
	if cfg.LockBackend != "redis" {
		return nil
	}
	server, rdb := strings.Join(cfg.RedisAddrs, ","), main
	if len(cfg.LockRedisAddrs) > 0 {
		var err error
		rdb, err = a.dialRedis(&redis.UniversalOptions{Addrs: cfg.LockRedisAddrs, MasterName: cfg.LockRedisSentinelMaster,
			ContextTimeoutEnabled: true})
		if err != nil {
			return fmt.Errorf("lock redis: %w", err)
		}
		a.ready = append(a.ready, readyCheck{"lock redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() }})
		a.lockRedis = rdb
		server = strings.Join(cfg.LockRedisAddrs, ",")
	}
	if !cfg.LocksOnEmbeddedRedis() {
		checkLockRedis(ctx, rdb, server, log)
	}
	return nil
}

// dialRedis returns a client on opts that the app closes, traced as the
// main Redis is.
func (a *app) dialRedis(opts *redis.UniversalOptions) (redis.UniversalClient, error) {
	rdb := redis.NewUniversalClient(opts)
	a.closers = append(a.closers, rdb.Close)
	// A span per command (and per pipeline), without the command's
	// arguments: keys name users, values hold stored answers.
	if err := redisotel.InstrumentTracing(rdb, redisotel.WithDBStatement(false)); err != nil {
		return nil, fmt.Errorf("redis tracing: %w", err)
	}
	return rdb, nil
}

// lockRedisCheckBudget bounds the settings check: a lock server that does
// not answer delays the start by this much at most (/readyz then names it).
const lockRedisCheckBudget = 2 * time.Second

// checkLockRedis warns when the settings of the server locks live on
// (every master of a Cluster) could lose a held lock: an eviction policy
// that may evict lock keys or fence counters, or no append-only file. A
// server that does not let shop read them (CONFIG renamed away, refused by
// an ACL or a managed service) gets no warning: shop cannot tell.
func checkLockRedis(ctx context.Context, rdb redis.UniversalClient, server string, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(ctx, lockRedisCheckBudget)
	defer cancel()
	check := func(ctx context.Context, node *redis.Client, attrs ...any) error {
		s, err := readLockRedisSettings(ctx, node)
		if err != nil {
			log.DebugContext(ctx, "lock redis settings not readable", slices.Concat([]any{"server", server, "err", err}, attrs)...)
			return nil
		}
		s.warn(ctx, log, slices.Concat([]any{"server", server}, attrs))
		return nil
	}
	switch c := rdb.(type) {
	case *redis.ClusterClient:
		_ = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return check(ctx, node, "node", node.Options().Addr)
		})
	case *redis.Client:
		_ = check(ctx, c)
	}
}

// lockRedisSettings are the server settings that decide whether a lock
// outlives memory pressure and a restart; "" is a setting the server did
// not report.
type lockRedisSettings struct {
	maxmemoryPolicy, maxmemory, appendonly string
}

func readLockRedisSettings(ctx context.Context, node *redis.Client) (lockRedisSettings, error) {
	var s lockRedisSettings
	// One parameter per CONFIG GET: Redis before 7 takes only one.
	for name, dst := range map[string]*string{
		"maxmemory-policy": &s.maxmemoryPolicy, "maxmemory": &s.maxmemory, "appendonly": &s.appendonly,
	} {
		v, err := node.ConfigGet(ctx, name).Result()
		if err != nil {
			return s, err
		}
		*dst = v[name]
	}
	return s, nil
}

// evicts names what the eviction policy may evict of a lock: volatile-*
// policies take keys with a TTL, which a lock key has and its fence
// counter has not; any other policy but noeviction takes any key. Even
// with maxmemory 0 (no limit yet) a policy is named: a limit can be set at
// run time, and the policy then applies at once.
func (s lockRedisSettings) evicts() string {
	switch {
	case s.maxmemoryPolicy == "" || s.maxmemoryPolicy == "noeviction":
		return ""
	case strings.HasPrefix(s.maxmemoryPolicy, "volatile-"):
		return "lock keys"
	}
	return "lock keys and fence counters"
}

func (s lockRedisSettings) warn(ctx context.Context, log *slog.Logger, attrs []any) {
	if what := s.evicts(); what != "" {
		log.WarnContext(ctx, "the lock Redis may evict held locks: an evicted lock key frees a lock its holder still "+
			"holds, and only the fence refuses that holder's writes; set maxmemory-policy noeviction (docs/operations.md)",
			slices.Concat(attrs, []any{"maxmemory_policy", s.maxmemoryPolicy, "evicts", what, "maxmemory", s.maxmemory})...)
	}
	if s.appendonly == "no" {
		log.WarnContext(ctx, "the lock Redis keeps no append-only file: a restart frees every held lock at once, and only "+
			"the fences refuse their holders' writes; set appendonly yes (docs/operations.md)",
			slices.Concat(attrs, []any{"appendonly", s.appendonly})...)
	}
}
