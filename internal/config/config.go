// Package config is shop's configuration: one struct filled from SHOP_*
// environment variables, with defaults that run on a machine with only Go
// (embedded SQLite and an in-process Redis-protocol server).
//
// Every field's variable, default and meaning is listed in docs/config.md;
// keep that table and the defaults below in step.
package config

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/lockbench/shop/internal/lockkit/registry"
)

// Backends are the lock backend names SHOP_LOCK_BACKEND accepts: those of
// the backend registry.
var Backends = registry.Names()

// Stock strategies SHOP_STOCK_STRATEGY accepts.
const (
	// StockLock reads, checks and writes the stock in Go under lock:stock:<sku>.
	StockLock = "lock"
	// StockAtomicSQL lets one conditional UPDATE do the check and the write.
	StockAtomicSQL = "atomic-sql"
	// StockAtomicRedis decrements a Redis mirror of the stock in one Lua
	// script, then writes SQL.
	StockAtomicRedis = "atomic-redis"
	// StockOptimistic reads, checks and writes without a lock, the write
	// landing only over the version it read; losers read again.
	StockOptimistic = "optimistic"
)

// Balance strategies SHOP_BALANCE_STRATEGY accepts (account.Strategy*).
const (
	BalanceLock       = "lock"
	BalanceOptimistic = "optimistic"
)

// Like strategies SHOP_LIKE_STRATEGY accepts; they are the names
// like.Options.Strategy takes (config imports no domain package, so a test checks
// that the two agree).
const (
	// LikeLock writes an entity's set and its owner's counter under
	// lock:like:<type>:<id>.
	LikeLock = "lock"
	// LikeHashTag puts an owner's keys in one hash slot and updates them in
	// one Lua script, without a lock.
	LikeHashTag = "hashtag"
)

// MaxKeyPrefixLen is the longest SHOP_KEY_PREFIX, in bytes: with the
// longest lock key shop makes (lock:like:<32>:<64>, 107 bytes) it stays
// within the 255 bytes of the mysql lock tables and memcached's 250.
const MaxKeyPrefixLen = 128

// DefaultHTTPAddr is SHOP_HTTP_ADDR's default.
const DefaultHTTPAddr = ":8080"

// DefaultMetricsAddr is SHOP_METRICS_ADDR's default: loopback only, so
// that nothing but the host itself (a local Prometheus, curl) reads the
// audit's results and the process's internals. A deployment names an
// address its scraper reaches (compose and Kubernetes: :9100).
const DefaultMetricsAddr = "127.0.0.1:9100"

// Environments SHOP_ENV accepts.
const (
	// EnvDev allows the public dev secrets and logs text by default.
	EnvDev = "dev"
	// EnvProduction (the default) refuses to start without real secrets and
	// logs JSON: a forgotten SHOP_ENV must not serve the public dev secrets.
	EnvProduction = "production"
)

// Dev credentials, used when SHOP_ENV=dev and the variables are unset. They
// are public (they are in this file), which is the point: `go run ./cmd/shop
// token 1` in another shell mints a token the dev server accepts.
const (
	DevJWTSecret  = "shop-dev-jwt-secret-not-for-production"
	DevAdminToken = "shop-dev-admin-token"
)

// minSecretLen is the shortest JWT secret accepted: HS256 keys shorter than
// the hash output (32 bytes) make brute force cheaper than the algorithm
// promises (RFC 7518 section 3.2). Production holds the admin token to the
// same length: it guards every balance and the reset.
const minSecretLen = 32

// Config is every setting of a shop process. Load fills it; the zero value
// is not meaningful.
type Config struct {
	// Env is SHOP_ENV: production (default) or dev. Production refuses the
	// dev secrets and admin tokens under 32 bytes, refuses the reset unless
	// AllowReset, and defaults the log format to json.
	Env string
	// HTTPAddr is SHOP_HTTP_ADDR, the listen address (default :8080). Port 0
	// picks a free port; the bound address is logged.
	HTTPAddr string
	// MetricsAddr is SHOP_METRICS_ADDR (default DefaultMetricsAddr): the
	// listener of /metrics, never served on HTTPAddr, so that the audit
	// results and the process's internals stay off the public port, unless
	// it is HTTPAddr's own value, which asks for exactly that.
	MetricsAddr string
	// LockBackend is SHOP_LOCK_BACKEND, one of Backends (default redis).
	LockBackend string
	// RedisAddrs is SHOP_REDIS_ADDRS, comma-separated. Empty (default) starts
	// an embedded in-process Redis-protocol server on a loopback port; one
	// address is a single server; several are a Redis Cluster, or Sentinels
	// when RedisSentinelMaster is set.
	RedisAddrs []string
	// RedisSentinelMaster is SHOP_REDIS_SENTINEL_MASTER: the master name;
	// when set, RedisAddrs are Sentinel addresses.
	RedisSentinelMaster string
	// LockRedisAddrs is SHOP_LOCK_REDIS_ADDRS: the Redis that backend
	// redis keeps its lock keys and fence counters on, in the shapes of
	// RedisAddrs. Empty (default) is the main Redis. Locks should not
	// share a server with caches: an eviction policy or a flush meant for
	// them frees held locks (docs/operations.md).
	LockRedisAddrs []string
	// LockRedisSentinelMaster is SHOP_LOCK_REDIS_SENTINEL_MASTER: the
	// master name; when set, LockRedisAddrs are Sentinel addresses.
	LockRedisSentinelMaster string
	// KeyPrefix is SHOP_KEY_PREFIX (default empty): prepended to every key
	// shop writes to shared stores (lock keys of every backend, the Redis
	// stock mirror), so that several shops or test runs can share one
	// server.
	KeyPrefix string
	// RedlockAddrs is SHOP_REDLOCK_ADDRS: the independent Redis masters of
	// the redlock backend, comma-separated.
	RedlockAddrs []string
	// MySQLDSN is SHOP_MYSQL_DSN (go-sql-driver format). When set, MySQL or
	// MariaDB stores the tables instead of SQLite. parseTime=true is added.
	MySQLDSN string
	// SQLitePath is SHOP_SQLITE_PATH, used when MySQLDSN is empty. Empty
	// (default) is a fresh file in a temporary directory, removed at exit:
	// with the embedded Redis the fence counters also start over at each
	// run, and fences of a previous run would refuse every write.
	SQLitePath string
	// DBMaxConns is SHOP_DB_MAX_CONNS (default 20): open connections per
	// process. Several instances share the server's max_connections (151 by
	// default on MariaDB). SQLite always uses one: one writer.
	DBMaxConns int
	// ZKAddrs is SHOP_ZK_ADDRS, comma-separated ZooKeeper servers.
	ZKAddrs []string
	// EtcdEndpoints is SHOP_ETCD_ENDPOINTS, comma-separated.
	EtcdEndpoints []string
	// MemcachedAddrs is SHOP_MEMCACHED_ADDRS, comma-separated.
	MemcachedAddrs []string
	// LockTTL is SHOP_LOCK_TTL. 0 (default) is the watchdog: a 30 s lease
	// renewed while the holder lives. From 1ms up it is a fixed lease that is
	// not renewed: a critical section longer than that loses its lock, and
	// fenced stores refuse its write.
	LockTTL time.Duration
	// LockWaitTimeout is SHOP_LOCK_WAIT_TIMEOUT (default 10s): the longest a
	// request waits for a lock before 503 with Retry-After. 0 waits as long
	// as the request lives.
	LockWaitTimeout time.Duration
	// StockStrategy is SHOP_STOCK_STRATEGY: lock (default), atomic-sql or
	// atomic-redis.
	StockStrategy string
	// LikeStrategy is SHOP_LIKE_STRATEGY: lock (default) or hashtag.
	LikeStrategy string
	// BalanceStrategy is SHOP_BALANCE_STRATEGY: lock (default) or
	// optimistic.
	BalanceStrategy string
	// OptimisticAttempts is SHOP_OPTIMISTIC_ATTEMPTS (default 8): the most
	// versioned writes one request of an optimistic strategy tries before
	// 503 conflict with Retry-After.
	OptimisticAttempts int
	// StockCombine is SHOP_STOCK_COMBINE (default 0): above 1, the lock
	// strategy serves up to this many queued purchases of one SKU per
	// process under one grant, in one transaction; 0 or 1 grants each
	// purchase alone.
	StockCombine int
	// LockMaxWaiters is SHOP_LOCK_MAX_WAITERS (default 64, 0 = no bound):
	// the most requests of one process that wait for one lock key; more,
	// or a queue whose expected wait passes SHOP_LOCK_WAIT_TIMEOUT, are
	// turned away at once with 503 lock-busy instead of queued.
	LockMaxWaiters int
	// IdemTTL is SHOP_IDEM_TTL (default 24h, always above 0): how long an
	// idempotency token lives from its issue. A retry after that gets 422
	// and must look the order up instead.
	IdemTTL time.Duration
	// IdemMaxTokens is SHOP_IDEM_MAX_TOKENS (default 1000, at least 1): the
	// live idempotency tokens one user may hold; minting more is 429.
	IdemMaxTokens int
	// OrderPayTimeout is SHOP_ORDER_PAY_TIMEOUT (default 15m, always above
	// 0): how long an order may await payment before the closer cancels it
	// and returns its stock.
	OrderPayTimeout time.Duration
	// OrderMaxUnpaidUnits is SHOP_ORDER_MAX_UNPAID_UNITS (default 10, at
	// least 1): the units one user may hold in orders awaiting payment.
	OrderMaxUnpaidUnits int64
	// CriticalSectionDelay is SHOP_CRITICAL_SECTION_DELAY (default 0): a
	// sleep between the read and the write of every read-modify-write,
	// standing in for business work. It widens the race window that the
	// locks close, so that load tests show it.
	CriticalSectionDelay time.Duration
	// JWTSecret is SHOP_JWT_SECRET: the HS256 key for user tokens, at least
	// 32 bytes. Dev default: DevJWTSecret.
	JWTSecret string
	// JWTMaxTTL is SHOP_JWT_MAX_TTL (default 24h, always above 0): the
	// longest lifetime (iat to exp) of a user token that is accepted.
	JWTMaxTTL time.Duration
	// AdminToken is SHOP_ADMIN_TOKEN: the bearer token of /admin routes, at
	// least 32 bytes in production. Dev default: DevAdminToken.
	AdminToken string
	// LogFormat is SHOP_LOG_FORMAT: text or json. Default text in dev, json
	// in production.
	LogFormat string
	// LogLevel is SHOP_LOG_LEVEL: debug, info (default), warn or error.
	LogLevel slog.Level
	// ShutdownTimeout is SHOP_SHUTDOWN_TIMEOUT (default 15s): how long
	// in-flight requests may run, once the listener is closed, before
	// their contexts are cancelled.
	ShutdownTimeout time.Duration
	// DrainDelay is SHOP_DRAIN_DELAY (default 5s in production, 0 in dev):
	// after SIGTERM, /readyz answers 503 for this long while requests are
	// still served, so that a load balancer stops sending new ones before
	// the listener closes.
	DrainDelay time.Duration
	// AllowReset is SHOP_ALLOW_RESET (default true in dev, false in
	// production): whether POST /admin/v1/reset may wipe the data.
	AllowReset bool
	// SlowQuery is SHOP_SLOW_QUERY (default 200ms): SQL statements slower
	// than this are logged at WARN. 0 turns the log off.
	SlowQuery time.Duration
	// MaxBodyBytes is SHOP_MAX_BODY_BYTES (default 65536): larger request
	// bodies are refused with 413.
	MaxBodyBytes int64
	// Admission is SHOP_ADMISSION (default true): whether every /api/v1
	// route sheds what it cannot serve under an adaptive concurrency limit.
	Admission bool
	// AdmissionTarget is SHOP_ADMISSION_TARGET (default 50ms): the mean
	// latency of a route past which its limit falls.
	AdmissionTarget time.Duration
	// AdmissionMinLimit and AdmissionMaxLimit are SHOP_ADMISSION_MIN_LIMIT
	// (default 2) and SHOP_ADMISSION_MAX_LIMIT (default 1024): the bounds of
	// each route's limit.
	AdmissionMinLimit, AdmissionMaxLimit int
	// Events are the order events' settings (SHOP_NATS_*, SHOP_EVENTS_*).
	Events Events
}

// Dedup ways SHOP_EVENTS_DEDUP accepts; they are events.DedupModes (a test
// checks that the two agree).
const (
	EventsDedupInbox = "inbox"
	EventsDedupLock  = "lock"
	EventsDedupNone  = "none"
)

// Load reads the configuration through getenv (os.Getenv in main). It
// returns every invalid value at once, each naming its variable.
func Load(getenv func(string) string) (Config, error) {
	p := parser{getenv: getenv}
	var c Config
	p.servers(&c)
	p.strategies(&c)
	p.process(&c)
	p.envDefaults(&c)
	p.consumer(&c)
	p.crossCheck(&c)
	p.events(&c)
	p.secrets(&c)
	p.backendNeeds(c)
	return c, errors.Join(p.errs...)
}

// servers reads where shop listens and the servers it talks to.
func (p *parser) servers(c *Config) {
	c.Env = p.oneOf("SHOP_ENV", EnvProduction, []string{EnvProduction, EnvDev})
	c.HTTPAddr = p.addr("SHOP_HTTP_ADDR", DefaultHTTPAddr)
	c.MetricsAddr = p.addr("SHOP_METRICS_ADDR", DefaultMetricsAddr)
	c.LockBackend = p.oneOf("SHOP_LOCK_BACKEND", "redis", Backends)
	c.RedisAddrs = p.addrs("SHOP_REDIS_ADDRS")
	c.RedisSentinelMaster = p.str("SHOP_REDIS_SENTINEL_MASTER", "")
	c.LockRedisAddrs = p.addrs("SHOP_LOCK_REDIS_ADDRS")
	c.LockRedisSentinelMaster = p.str("SHOP_LOCK_REDIS_SENTINEL_MASTER", "")
	c.KeyPrefix = p.keyPrefix("SHOP_KEY_PREFIX")
	c.RedlockAddrs = p.addrs("SHOP_REDLOCK_ADDRS")
	c.MySQLDSN = p.str("SHOP_MYSQL_DSN", "")
	c.SQLitePath = p.str("SHOP_SQLITE_PATH", "")
	c.DBMaxConns = int(p.int("SHOP_DB_MAX_CONNS", 20, 1))
	c.ZKAddrs = p.addrs("SHOP_ZK_ADDRS")
	c.EtcdEndpoints = p.list("SHOP_ETCD_ENDPOINTS")
	c.MemcachedAddrs = p.addrs("SHOP_MEMCACHED_ADDRS")
}

// strategies reads how the flows run: their locks, strategies, tokens and
// timeouts.
func (p *parser) strategies(c *Config) {
	c.LockTTL = p.duration("SHOP_LOCK_TTL", 0)
	if c.LockTTL > 0 && c.LockTTL < time.Millisecond {
		// Redis counts a lease in whole milliseconds.
		p.fail("SHOP_LOCK_TTL", "is %s; want 0 (the watchdog) or at least 1ms", c.LockTTL)
	}
	c.LockWaitTimeout = p.duration("SHOP_LOCK_WAIT_TIMEOUT", 10*time.Second)
	c.StockStrategy = p.oneOf("SHOP_STOCK_STRATEGY", StockLock, []string{StockLock, StockAtomicSQL, StockAtomicRedis, StockOptimistic})
	c.LikeStrategy = p.oneOf("SHOP_LIKE_STRATEGY", LikeLock, []string{LikeLock, LikeHashTag})
	c.BalanceStrategy = p.oneOf("SHOP_BALANCE_STRATEGY", BalanceLock, []string{BalanceLock, BalanceOptimistic})
	c.OptimisticAttempts = int(p.int("SHOP_OPTIMISTIC_ATTEMPTS", 8, 1))
	c.LockMaxWaiters = int(p.int("SHOP_LOCK_MAX_WAITERS", 64, 0))
	c.StockCombine = int(p.int("SHOP_STOCK_COMBINE", 0, 0))
	c.IdemTTL = p.positiveDuration("SHOP_IDEM_TTL", 24*time.Hour)
	c.IdemMaxTokens = int(p.int("SHOP_IDEM_MAX_TOKENS", 1000, 1))
	c.OrderPayTimeout = p.positiveDuration("SHOP_ORDER_PAY_TIMEOUT", 15*time.Minute)
	c.OrderMaxUnpaidUnits = p.int("SHOP_ORDER_MAX_UNPAID_UNITS", 10, 1)
	c.CriticalSectionDelay = p.duration("SHOP_CRITICAL_SECTION_DELAY", 0)
}

// process reads the secrets, the logs and the limits of the process.
func (p *parser) process(c *Config) {
	c.JWTSecret = p.str("SHOP_JWT_SECRET", "")
	c.JWTMaxTTL = p.positiveDuration("SHOP_JWT_MAX_TTL", 24*time.Hour)
	c.AdminToken = p.str("SHOP_ADMIN_TOKEN", "")
	c.LogLevel = p.level("SHOP_LOG_LEVEL")
	c.ShutdownTimeout = p.duration("SHOP_SHUTDOWN_TIMEOUT", 15*time.Second)
	c.MaxBodyBytes = p.int("SHOP_MAX_BODY_BYTES", 64<<10, 1)
	c.SlowQuery = p.duration("SHOP_SLOW_QUERY", 200*time.Millisecond)
	c.Admission = p.bool("SHOP_ADMISSION", true)
	c.AdmissionTarget = p.positiveDuration("SHOP_ADMISSION_TARGET", 50*time.Millisecond)
	c.AdmissionMinLimit = int(p.int("SHOP_ADMISSION_MIN_LIMIT", 2, 2))
	c.AdmissionMaxLimit = int(p.int("SHOP_ADMISSION_MAX_LIMIT", 1024, 2))
}

// consumer reads the order-event consumer's settings.
func (p *parser) consumer(c *Config) {
	c.Events.Dedup = p.oneOf("SHOP_EVENTS_DEDUP", EventsDedupInbox, []string{EventsDedupInbox, EventsDedupLock, EventsDedupNone})
	c.Events.AckWait = p.positiveDuration("SHOP_EVENTS_ACK_WAIT", 30*time.Second)
	c.Events.MaxDeliver = int(p.int("SHOP_EVENTS_MAX_DELIVER", 5, 1))
	c.Events.ConsumeInServe = p.bool("SHOP_EVENTS_CONSUME_IN_SERVE", true)
}

// envDefaults reads the settings whose default depends on SHOP_ENV.
// Production defaults suit a process behind a load balancer; dev ones a
// developer's terminal, where Ctrl-C should stop at once.
func (p *parser) envDefaults(c *Config) {
	dev := c.Env == EnvDev
	c.LogFormat = p.oneOf("SHOP_LOG_FORMAT", pick(dev, "text", "json"), []string{"text", "json"})
	c.DrainDelay = p.duration("SHOP_DRAIN_DELAY", pick(dev, 0, 5*time.Second))
	c.AllowReset = p.bool("SHOP_ALLOW_RESET", dev)
}

// crossCheck checks the settings that depend on each other, and the DSN.
func (p *parser) crossCheck(c *Config) {
	if c.MySQLDSN != "" {
		dsn, err := normalizeDSN(c.MySQLDSN)
		if err != nil {
			p.fail("SHOP_MYSQL_DSN", "%v", err)
		}
		c.MySQLDSN = dsn
	}
	if c.AdmissionMaxLimit < c.AdmissionMinLimit {
		p.fail("SHOP_ADMISSION_MAX_LIMIT", "is %d, under SHOP_ADMISSION_MIN_LIMIT %d", c.AdmissionMaxLimit, c.AdmissionMinLimit)
	}
	if c.RedisSentinelMaster != "" && len(c.RedisAddrs) == 0 {
		p.fail("SHOP_REDIS_SENTINEL_MASTER", "needs the Sentinel addresses in SHOP_REDIS_ADDRS")
	}
	if c.LockRedisSentinelMaster != "" && len(c.LockRedisAddrs) == 0 {
		p.fail("SHOP_LOCK_REDIS_SENTINEL_MASTER", "needs the Sentinel addresses in SHOP_LOCK_REDIS_ADDRS")
	}
}

func pick[T any](cond bool, yes, no T) T {
	if cond {
		return yes
	}
	return no
}

// Dev reports whether the public dev credentials are in use.
func (c Config) Dev() bool {
	return c.JWTSecret == DevJWTSecret || c.AdminToken == DevAdminToken
}

// MetricsOnHTTPAddr reports whether /metrics is served on the API
// listener: SHOP_METRICS_ADDR names SHOP_HTTP_ADDR's own value.
func (c Config) MetricsOnHTTPAddr() bool { return c.MetricsAddr == c.HTTPAddr }

// EmbeddedRedis reports whether shop starts its own in-process Redis server.
func (c Config) EmbeddedRedis() bool { return len(c.RedisAddrs) == 0 }

// LocksOnEmbeddedRedis reports whether the lock keys and fence counters
// live on the embedded Redis: backend redis with neither
// SHOP_LOCK_REDIS_ADDRS nor SHOP_REDIS_ADDRS set. Nothing outside this
// process can then hold a lock or remember a token.
func (c Config) LocksOnEmbeddedRedis() bool {
	return c.LockBackend == "redis" && len(c.LockRedisAddrs) == 0 && c.EmbeddedRedis()
}

// LogValue prints the configuration with secrets masked, so that it can be
// logged at start: the JWT secret, the admin token and the DSN password.
func (c Config) LogValue() slog.Value {
	attrs := slices.Concat(c.serverAttrs(), c.strategyAttrs(), c.processAttrs(), c.eventAttrs(), c.consumerAttrs())
	return slog.GroupValue(attrs...)
}

// serverAttrs are the settings servers reads.
func (c Config) serverAttrs() []slog.Attr {
	return []slog.Attr{
		slog.String("env", c.Env),
		slog.String("http_addr", c.HTTPAddr),
		slog.String("metrics_addr", c.MetricsAddr),
		slog.String("lock_backend", c.LockBackend),
		slog.String("redis_addrs", orDefault(strings.Join(c.RedisAddrs, ","), "(embedded)")),
		slog.String("redis_sentinel_master", c.RedisSentinelMaster),
		slog.String("lock_redis_addrs", orDefault(strings.Join(c.LockRedisAddrs, ","), "(the main redis)")),
		slog.String("lock_redis_sentinel_master", c.LockRedisSentinelMaster),
		slog.String("key_prefix", c.KeyPrefix),
		slog.String("redlock_addrs", strings.Join(c.RedlockAddrs, ",")),
		slog.String("mysql_dsn", maskDSN(c.MySQLDSN)),
		slog.String("sqlite_path", orDefault(c.SQLitePath, "(temporary)")),
		slog.Int("db_max_conns", c.DBMaxConns),
		slog.String("zk_addrs", strings.Join(c.ZKAddrs, ",")),
		slog.String("etcd_endpoints", strings.Join(c.EtcdEndpoints, ",")),
		slog.String("memcached_addrs", strings.Join(c.MemcachedAddrs, ",")),
	}
}

// strategyAttrs are the settings strategies reads.
func (c Config) strategyAttrs() []slog.Attr {
	return []slog.Attr{
		slog.Duration("lock_ttl", c.LockTTL),
		slog.Duration("lock_wait_timeout", c.LockWaitTimeout),
		slog.String("stock_strategy", c.StockStrategy),
		slog.String("like_strategy", c.LikeStrategy),
		slog.String("balance_strategy", c.BalanceStrategy),
		slog.Int("optimistic_attempts", c.OptimisticAttempts),
		slog.Int("lock_max_waiters", c.LockMaxWaiters),
		slog.Int("stock_combine", c.StockCombine),
		slog.Duration("idem_ttl", c.IdemTTL),
		slog.Int("idem_max_tokens", c.IdemMaxTokens),
		slog.Duration("order_pay_timeout", c.OrderPayTimeout),
		slog.Int64("order_max_unpaid_units", c.OrderMaxUnpaidUnits),
		slog.Duration("critical_section_delay", c.CriticalSectionDelay),
	}
}

// processAttrs are the settings process and envDefaults read.
func (c Config) processAttrs() []slog.Attr {
	return []slog.Attr{
		slog.String("jwt_secret", mask(c.JWTSecret)),
		slog.Duration("jwt_max_ttl", c.JWTMaxTTL),
		slog.String("admin_token", mask(c.AdminToken)),
		slog.String("log_format", c.LogFormat),
		slog.String("log_level", c.LogLevel.String()),
		slog.Duration("shutdown_timeout", c.ShutdownTimeout),
		slog.Duration("drain_delay", c.DrainDelay),
		slog.Bool("allow_reset", c.AllowReset),
		slog.Duration("slow_query", c.SlowQuery),
		slog.Int64("max_body_bytes", c.MaxBodyBytes),
		slog.Bool("admission", c.Admission),
		slog.Duration("admission_target", c.AdmissionTarget),
	}
}

// consumerAttrs are the settings consumer reads.
func (c Config) consumerAttrs() []slog.Attr {
	return []slog.Attr{
		slog.String("events_dedup", c.Events.Dedup),
		slog.Duration("events_ack_wait", c.Events.AckWait),
		slog.Int("events_max_deliver", c.Events.MaxDeliver),
		slog.Bool("events_consume_in_serve", c.Events.ConsumeInServe),
	}
}

func orDefault(s, d string) string {
	if s == "" {
		return d
	}
	return s
}

// mask shows that a secret is set, and which dev one it is, never its value.
func mask(secret string) string {
	switch secret {
	case "":
		return ""
	case DevJWTSecret, DevAdminToken:
		return "(dev default)"
	}
	return "********"
}

func maskDSN(dsn string) string {
	if dsn == "" {
		return ""
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "********"
	}
	if cfg.Passwd != "" {
		cfg.Passwd = "********"
	}
	return cfg.FormatDSN()
}

// normalizeDSN checks the DSN and turns on parseTime, without which the
// driver cannot scan DATETIME columns into time.Time.
func normalizeDSN(dsn string) (string, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("not a go-sql-driver DSN (user:pass@tcp(host:3306)/db): %w", err)
	}
	if cfg.DBName == "" {
		return "", errors.New("names no database (…/shop?parseTime=true)")
	}
	cfg.ParseTime = true
	// RowsAffected must count rows the WHERE matched, not rows whose values
	// changed: an unfenced write of the balance a row already has is still
	// a write, and 0 would read as "refused".
	cfg.ClientFoundRows = true
	return cfg.FormatDSN(), nil
}

func (p *parser) secrets(c *Config) {
	if c.Env == EnvDev {
		if c.JWTSecret == "" {
			c.JWTSecret = DevJWTSecret
		}
		if c.AdminToken == "" {
			c.AdminToken = DevAdminToken
		}
	}
	switch {
	case c.JWTSecret == "":
		p.fail("SHOP_JWT_SECRET", "is required when SHOP_ENV=%s", c.Env)
	case c.Env == EnvProduction && c.JWTSecret == DevJWTSecret:
		p.fail("SHOP_JWT_SECRET", "is the public dev secret; production needs its own")
	case len(c.JWTSecret) < minSecretLen:
		p.fail("SHOP_JWT_SECRET", "is %d bytes; HS256 needs at least %d", len(c.JWTSecret), minSecretLen)
	}
	switch {
	case c.AdminToken == "":
		p.fail("SHOP_ADMIN_TOKEN", "is required when SHOP_ENV=%s", c.Env)
	case c.Env == EnvProduction && c.AdminToken == DevAdminToken:
		p.fail("SHOP_ADMIN_TOKEN", "is the public dev token; production needs its own")
	case c.Env == EnvProduction && len(c.AdminToken) < minSecretLen:
		p.fail("SHOP_ADMIN_TOKEN", "is %d bytes; production needs at least %d (openssl rand -hex 32)", len(c.AdminToken), minSecretLen)
	}
	// One leaked value must not be both: the admin token would mint user
	// tokens, and the signing secret would open the admin API.
	if c.JWTSecret != "" && c.JWTSecret == c.AdminToken {
		p.fail("SHOP_JWT_SECRET", "is SHOP_ADMIN_TOKEN; give each its own value")
	}
}

// backendNeeds checks that the chosen backend has the setting its registry
// entry needs, so that a typo fails at start rather than at the first
// request.
func (p *parser) backendNeeds(c Config) {
	b, ok := registry.Lookup(c.LockBackend)
	if !ok || b.Needs == "" {
		return
	}
	set, known := c.isSet(b.Needs)
	if !known {
		p.fail("SHOP_LOCK_BACKEND", "%s needs %s, which config does not read", c.LockBackend, b.Needs)
	} else if !set {
		p.fail("SHOP_LOCK_BACKEND", "%s needs %s", c.LockBackend, b.Needs)
	}
}

// isSet reports whether the server setting named by its variable is set;
// known is false for a variable that is not one of them.
func (c Config) isSet(variable string) (set, known bool) {
	switch variable {
	case "SHOP_REDIS_ADDRS":
		return len(c.RedisAddrs) > 0, true
	case "SHOP_REDLOCK_ADDRS":
		return len(c.RedlockAddrs) > 0, true
	case "SHOP_MYSQL_DSN":
		return c.MySQLDSN != "", true
	case "SHOP_ZK_ADDRS":
		return len(c.ZKAddrs) > 0, true
	case "SHOP_ETCD_ENDPOINTS":
		return len(c.EtcdEndpoints) > 0, true
	case "SHOP_MEMCACHED_ADDRS":
		return len(c.MemcachedAddrs) > 0, true
	}
	return false, false
}

type parser struct {
	getenv func(string) string
	errs   []error
}

func (p *parser) fail(name, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s %s", name, fmt.Sprintf(format, args...)))
}

func (p *parser) keyPrefix(name string) string {
	v := p.str(name, "")
	if len(v) > MaxKeyPrefixLen {
		p.fail(name, "is %d bytes long; at most %d fit in front of every lock key", len(v), MaxKeyPrefixLen)
		return ""
	}
	if i := strings.IndexFunc(v, func(r rune) bool { return r <= ' ' || r == 0x7f }); i >= 0 {
		p.fail(name, "has a space or control character at byte %d; lock servers such as memcached refuse such keys", i)
		return ""
	}
	return v
}

func (p *parser) str(name, def string) string {
	if v := strings.TrimSpace(p.getenv(name)); v != "" {
		return v
	}
	return def
}

func (p *parser) oneOf(name, def string, allowed []string) string {
	v := p.str(name, def)
	if !slices.Contains(allowed, v) {
		p.fail(name, "is %q; want one of %s", v, strings.Join(allowed, ", "))
	}
	return v
}

func (p *parser) duration(name string, def time.Duration) time.Duration {
	v := p.str(name, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		p.fail(name, "is %q; want a non-negative Go duration such as 500ms or 10s", v)
		return def
	}
	return d
}

// positiveDuration is duration for a lifetime, where 0 would not mean
// "off" but "expired at once".
func (p *parser) positiveDuration(name string, def time.Duration) time.Duration {
	v := p.str(name, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		p.fail(name, "is %q; want a positive Go duration such as 1h or 24h", v)
		return def
	}
	return d
}

func (p *parser) int(name string, def, min int64) int64 {
	v := p.str(name, "")
	if v == "" {
		return def
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < min {
		p.fail(name, "is %q; want an integer >= %d", v, min)
		return def
	}
	return n
}

func (p *parser) bool(name string, def bool) bool {
	v := p.str(name, "")
	if v == "" {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		p.fail(name, "is %q; want true or false", v)
		return def
	}
	return b
}

func (p *parser) level(name string) slog.Level {
	var l slog.Level
	if v := p.str(name, "info"); l.UnmarshalText([]byte(v)) != nil {
		p.fail(name, "is %q; want debug, info, warn or error", v)
	}
	return l
}

func (p *parser) list(name string) []string {
	var out []string
	for _, s := range strings.Split(p.getenv(name), ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

func (p *parser) addrs(name string) []string {
	out := p.list(name)
	for _, a := range out {
		_, port, err := net.SplitHostPort(a)
		if err != nil {
			p.fail(name, "has %q; want host:port", a)
			continue
		}
		// A service name (host:redis) is left to the dialer, as net.Dial takes it.
		if n, err := strconv.Atoi(port); err == nil && (n < 1 || n > 65535) {
			p.fail(name, "has %q; the port must be from 1 to 65535", a)
		}
	}
	return out
}

// addr checks a listen address here, so that a port net.Listen would
// refuse is a configuration error (exit 2), not a failure at start.
func (p *parser) addr(name, def string) string {
	v := p.str(name, def)
	_, port, err := net.SplitHostPort(v)
	if err != nil {
		p.fail(name, "is %q; want host:port or :port", v)
		return v
	}
	if n, err := strconv.Atoi(port); err != nil || n < 0 || n > 65535 {
		p.fail(name, "is %q; the port must be a number from 0 to 65535", v)
	}
	return v
}
