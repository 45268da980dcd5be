package config

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/like"
	"github.com/lockbench/shop/internal/lockkit/registry"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

// Nothing set is production: a forgotten SHOP_ENV must not serve the
// public dev secrets.
func TestNothingSetIsProduction(t *testing.T) {
	_, err := Load(env(nil))
	if err == nil {
		t.Fatal("started with no secrets")
	}
	for _, name := range []string{"SHOP_JWT_SECRET", "SHOP_ADMIN_TOKEN"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s:\n%v", name, err)
		}
	}
	c, err := Load(env(map[string]string{"SHOP_JWT_SECRET": strings.Repeat("s", 32), "SHOP_ADMIN_TOKEN": strings.Repeat("a", 32)}))
	if err != nil || c.Env != EnvProduction || c.AllowReset || c.DrainDelay != 5*time.Second || c.LogFormat != "json" {
		t.Errorf("secrets only: %+v, %v", c, err)
	}
}

func TestDevRunsWithOnlyGo(t *testing.T) {
	c, err := Load(env(map[string]string{"SHOP_ENV": "dev"}))
	if err != nil {
		t.Fatal(err)
	}
	for name, ok := range map[string]bool{
		"HTTPAddr":        c.HTTPAddr == ":8080",
		"LockBackend":     c.LockBackend == "redis",
		"EmbeddedRedis":   c.EmbeddedRedis(),
		"MySQLDSN":        c.MySQLDSN == "",
		"StockStrategy":   c.StockStrategy == StockLock,
		"LikeStrategy":    c.LikeStrategy == LikeLock,
		"IdemTTL":         c.IdemTTL == 24*time.Hour,
		"LogFormat":       c.LogFormat == "text",
		"LockWaitTimeout": c.LockWaitTimeout == 10*time.Second,
		"JWTSecret":       c.JWTSecret == DevJWTSecret,
		"AdminToken":      c.AdminToken == DevAdminToken,
		"Dev":             c.Dev(),
		"AllowReset":      c.AllowReset,
		"DrainDelay":      c.DrainDelay == 0,
		"MetricsAddr":     c.MetricsAddr == DefaultMetricsAddr,
		"SlowQuery":       c.SlowQuery == 200*time.Millisecond,
	} {
		if !ok {
			t.Errorf("default %s: %+v", name, c)
		}
	}
}

func TestInvalidValuesAreAllReported(t *testing.T) {
	_, err := Load(env(map[string]string{
		"SHOP_LOCK_BACKEND":           "zookeper",
		"SHOP_LOCK_TTL":               "10",
		"SHOP_CRITICAL_SECTION_DELAY": "-5ms",
		"SHOP_STOCK_STRATEGY":         "pessimistic",
		"SHOP_BALANCE_STRATEGY":       "atomic-sql",
		"SHOP_LOCK_MAX_WAITERS":       "-1",
		"SHOP_REDIS_ADDRS":            "localhost",
		"SHOP_DB_MAX_CONNS":           "0",
		"SHOP_MYSQL_DSN":              "not a dsn",
		"SHOP_LIKE_STRATEGY":          "optimistic",
		"SHOP_IDEM_TTL":               "1 day",
		"SHOP_HTTP_ADDR":              ":99999",
		"SHOP_METRICS_ADDR":           "127.0.0.1:-1",
		"SHOP_ALLOW_RESET":            "maybe",
		"SHOP_DRAIN_DELAY":            "5",
		"SHOP_SLOW_QUERY":             "fast",
	}))
	if err == nil {
		t.Fatal("no error")
	}
	for _, name := range []string{"SHOP_LOCK_BACKEND", "SHOP_LOCK_TTL", "SHOP_CRITICAL_SECTION_DELAY",
		"SHOP_STOCK_STRATEGY", "SHOP_REDIS_ADDRS", "SHOP_DB_MAX_CONNS", "SHOP_MYSQL_DSN",
		"SHOP_LIKE_STRATEGY", "SHOP_IDEM_TTL", "SHOP_HTTP_ADDR", "SHOP_METRICS_ADDR", "SHOP_ALLOW_RESET",
		"SHOP_DRAIN_DELAY", "SHOP_SLOW_QUERY", "SHOP_BALANCE_STRATEGY", "SHOP_LOCK_MAX_WAITERS"} {
		if !strings.Contains(err.Error(), name) {
			t.Errorf("error does not name %s:\n%v", name, err)
		}
	}
}

func TestProductionRefusesDevSecrets(t *testing.T) {
	for name, vars := range map[string]map[string]string{
		"unset":       {"SHOP_ENV": "production"},
		"dev secrets": {"SHOP_ENV": "production", "SHOP_JWT_SECRET": DevJWTSecret, "SHOP_ADMIN_TOKEN": DevAdminToken},
		"short":       {"SHOP_ENV": "production", "SHOP_JWT_SECRET": "short", "SHOP_ADMIN_TOKEN": "x"},
		"short admin": {"SHOP_ENV": "production", "SHOP_JWT_SECRET": strings.Repeat("s", 32), "SHOP_ADMIN_TOKEN": strings.Repeat("a", 31)},
	} {
		if _, err := Load(env(vars)); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	c, err := Load(env(map[string]string{"SHOP_ENV": "production",
		"SHOP_JWT_SECRET": strings.Repeat("s", 32), "SHOP_ADMIN_TOKEN": strings.Repeat("a", 32)}))
	if err != nil || c.LogFormat != "json" || c.Dev() {
		t.Errorf("production: %+v, %v", c, err)
	}
}

func TestBackendNeedsItsServers(t *testing.T) {
	for _, b := range []string{"redlock", "mysql", "mysql-forupdate", "zookeeper", "etcd", "memcached"} {
		if _, err := Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_LOCK_BACKEND": b})); err == nil {
			t.Errorf("%s without servers: accepted", b)
		}
	}
}

// Every registered backend is accepted with the setting it needs and
// refused, naming that setting, without it.
func TestEveryRegisteredBackendLoads(t *testing.T) {
	for _, b := range registry.Backends() {
		vars := map[string]string{"SHOP_ENV": "dev", "SHOP_LOCK_BACKEND": b.Name}
		if b.Needs != "" {
			_, err := Load(env(vars))
			if err == nil || !strings.Contains(err.Error(), b.Needs) {
				t.Errorf("%s without %s: %v", b.Name, b.Needs, err)
			}
			// Every server setting is a list of addresses but the DSN.
			vars[b.Needs] = "127.0.0.1:1,127.0.0.1:2"
			if b.Needs == "SHOP_MYSQL_DSN" {
				vars[b.Needs] = "root:@tcp(127.0.0.1:3306)/shop"
			}
		}
		if c, err := Load(env(vars)); err != nil || c.LockBackend != b.Name {
			t.Errorf("%s with what it needs: %+v, %v", b.Name, c.LockBackend, err)
		}
	}
}

func TestLogValueMasksSecrets(t *testing.T) {
	c, err := Load(env(map[string]string{
		"SHOP_JWT_SECRET":  "jwt-secret-value-0123456789abcdefgh",
		"SHOP_ADMIN_TOKEN": "admin-token-value-0123456789abcdef",
		"SHOP_MYSQL_DSN":   "shop:dsn-password@tcp(127.0.0.1:3306)/shop",
	}))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	slog.New(slog.NewTextHandler(&b, nil)).Info("config", "config", c)
	out := b.String()
	for _, secret := range []string{"jwt-secret-value", "admin-token-value", "dsn-password"} {
		if strings.Contains(out, secret) {
			t.Errorf("log shows %q:\n%s", secret, out)
		}
	}
	if !strings.Contains(out, "shop:********@tcp(127.0.0.1:3306)/shop") {
		t.Errorf("masked DSN missing:\n%s", out)
	}
}

// An idempotency token that expires as it is issued would turn every retry
// into 422, so 0 is refused rather than read as "off".
func TestIdemTTLMustBePositive(t *testing.T) {
	for _, v := range []string{"0", "0s", "-1h", "24"} {
		_, err := Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_IDEM_TTL": v}))
		if err == nil || !strings.Contains(err.Error(), "SHOP_IDEM_TTL") {
			t.Errorf("SHOP_IDEM_TTL=%s: %v", v, err)
		}
	}
	c, err := Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_IDEM_TTL": "90m", "SHOP_LIKE_STRATEGY": "hashtag"}))
	if err != nil || c.IdemTTL != 90*time.Minute || c.LikeStrategy != LikeHashTag {
		t.Errorf("valid values: %+v, %v", c, err)
	}
}

// A cap of 0 would refuse every token: it is refused rather than read as
// "no cap", which would let one user fill Redis.
func TestIdemMaxTokens(t *testing.T) {
	for _, v := range []string{"0", "-1", "many"} {
		_, err := Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_IDEM_MAX_TOKENS": v}))
		if err == nil || !strings.Contains(err.Error(), "SHOP_IDEM_MAX_TOKENS") {
			t.Errorf("SHOP_IDEM_MAX_TOKENS=%s: %v", v, err)
		}
	}
	for v, want := range map[string]int{"": 1000, "5": 5} {
		c, err := Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_IDEM_MAX_TOKENS": v}))
		if err != nil || c.IdemMaxTokens != want {
			t.Errorf("SHOP_IDEM_MAX_TOKENS=%q: %d, %v; want %d", v, c.IdemMaxTokens, err, want)
		}
	}
}

// The strategy names are passed through to the domain packages unchanged.
func TestStrategyNamesMatchTheDomains(t *testing.T) {
	for _, pair := range [][2]string{
		{StockLock, inventory.StrategyLock},
		{StockAtomicSQL, inventory.StrategyAtomicSQL},
		{StockAtomicRedis, inventory.StrategyAtomicRedis},
		{LikeLock, like.StrategyLock},
		{LikeHashTag, like.StrategyHashTag},
		{EventsDedupInbox, events.DedupModes[0]},
		{EventsDedupLock, events.DedupModes[1]},
		{EventsDedupNone, events.DedupModes[2]},
	} {
		if pair[0] != pair[1] {
			t.Errorf("config says %q, the domain %q", pair[0], pair[1])
		}
	}
}

// TestMetricsAreOffThePublicPortUnlessAskedFor: /metrics (the audit's
// results, the process's internals) has a loopback listener of its own
// by default, in dev as in production; naming SHOP_HTTP_ADDR's own
// address serves it there.
func TestMetricsAreOffThePublicPortUnlessAskedFor(t *testing.T) {
	for _, e := range []string{EnvDev, EnvProduction} {
		c, err := Load(env(map[string]string{"SHOP_ENV": e,
			"SHOP_JWT_SECRET": strings.Repeat("s", 32), "SHOP_ADMIN_TOKEN": strings.Repeat("a", 32)}))
		if err != nil || c.MetricsAddr != DefaultMetricsAddr || c.MetricsOnHTTPAddr() {
			t.Errorf("%s default: metrics on %q (on the API port: %t), %v; want %s only", e, c.MetricsAddr, c.MetricsOnHTTPAddr(), err, DefaultMetricsAddr)
		}
	}
	dev := map[string]string{"SHOP_ENV": "dev", "SHOP_METRICS_ADDR": ":9100"}
	if c, err := Load(env(dev)); err != nil || c.MetricsAddr != ":9100" || c.MetricsOnHTTPAddr() {
		t.Errorf("SHOP_METRICS_ADDR=:9100: %+v, %v", c, err)
	}
	dev["SHOP_METRICS_ADDR"] = DefaultHTTPAddr
	if c, err := Load(env(dev)); err != nil || !c.MetricsOnHTTPAddr() {
		t.Errorf("SHOP_METRICS_ADDR=SHOP_HTTP_ADDR: on the API port %t, %v; want asked for", c.MetricsOnHTTPAddr(), err)
	}
}

// An order that must be paid within 0 s would be cancelled as it is
// placed: 0 is refused; the default is 15 minutes.
func TestOrderPayTimeout(t *testing.T) {
	for _, v := range []string{"0", "-1m", "soon"} {
		if _, err := Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_ORDER_PAY_TIMEOUT": v})); err == nil ||
			!strings.Contains(err.Error(), "SHOP_ORDER_PAY_TIMEOUT") {
			t.Errorf("SHOP_ORDER_PAY_TIMEOUT=%s: %v", v, err)
		}
	}
	c, err := Load(env(map[string]string{"SHOP_ENV": "dev"}))
	if err != nil || c.OrderPayTimeout != 15*time.Minute {
		t.Errorf("default: %s, %v", c.OrderPayTimeout, err)
	}
	c, err = Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_ORDER_PAY_TIMEOUT": "3s"}))
	if err != nil || c.OrderPayTimeout != 3*time.Second {
		t.Errorf("3s: %s, %v", c.OrderPayTimeout, err)
	}
}

// The prefix goes in front of every lock key: on mysql it must leave room
// for the longest key in the 255-byte lock tables, and memcached refuses a
// key with whitespace or control characters.
func TestKeyPrefixFitsEveryBackend(t *testing.T) {
	for _, v := range []string{strings.Repeat("p", MaxKeyPrefixLen+1), "shop a:", "sh\top", "shop\x01"} {
		_, err := Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_KEY_PREFIX": v}))
		if err == nil || !strings.Contains(err.Error(), "SHOP_KEY_PREFIX") {
			t.Errorf("SHOP_KEY_PREFIX=%q: %v, want it refused", v, err)
		}
	}
	for _, v := range []string{"shoptest:cmdshop:ab12:", strings.Repeat("p", MaxKeyPrefixLen), "team/shop-1."} {
		c, err := Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_KEY_PREFIX": v}))
		if err != nil || c.KeyPrefix != v {
			t.Errorf("SHOP_KEY_PREFIX=%q: %q, %v", v, c.KeyPrefix, err)
		}
	}
}

// TestJWTSecretMustDifferFromTheAdminToken: whoever reads one of them
// (a log, an environment dump) must not hold both: the admin token would
// mint user tokens, and a user token secret would open the admin API.
func TestJWTSecretMustDifferFromTheAdminToken(t *testing.T) {
	same := strings.Repeat("k", 40)
	for _, e := range []string{EnvProduction, EnvDev} {
		_, err := Load(env(map[string]string{"SHOP_ENV": e, "SHOP_JWT_SECRET": same, "SHOP_ADMIN_TOKEN": same}))
		if err == nil || !strings.Contains(err.Error(), "SHOP_JWT_SECRET") || !strings.Contains(err.Error(), "SHOP_ADMIN_TOKEN") {
			t.Errorf("%s, one value for both: %v, want refused naming both", e, err)
		}
	}
}

func TestJWTMaxTTL(t *testing.T) {
	dev := map[string]string{"SHOP_ENV": "dev"}
	if c, err := Load(env(dev)); err != nil || c.JWTMaxTTL != 24*time.Hour {
		t.Errorf("default: %s, %v; want 24h", c.JWTMaxTTL, err)
	}
	dev["SHOP_JWT_MAX_TTL"] = "1h"
	if c, err := Load(env(dev)); err != nil || c.JWTMaxTTL != time.Hour {
		t.Errorf("SHOP_JWT_MAX_TTL=1h: %s, %v", c.JWTMaxTTL, err)
	}
	for _, bad := range []string{"0", "-1h", "a day"} {
		dev["SHOP_JWT_MAX_TTL"] = bad
		if _, err := Load(env(dev)); err == nil || !strings.Contains(err.Error(), "SHOP_JWT_MAX_TTL") {
			t.Errorf("SHOP_JWT_MAX_TTL=%s: %v, want refused", bad, err)
		}
	}
}

func TestEventsConsumerSettings(t *testing.T) {
	c, err := Load(env(map[string]string{"SHOP_ENV": "dev"}))
	if err != nil || c.Events.Dedup != EventsDedupInbox || c.Events.AckWait != 30*time.Second || c.Events.MaxDeliver != 5 ||
		!c.Events.ConsumeInServe {
		t.Fatalf("defaults: %+v, %v", c, err)
	}
	_, err = Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_EVENTS_DEDUP": "watermill",
		"SHOP_EVENTS_ACK_WAIT": "0s", "SHOP_EVENTS_MAX_DELIVER": "0"}))
	for _, name := range []string{"SHOP_EVENTS_DEDUP", "SHOP_EVENTS_ACK_WAIT", "SHOP_EVENTS_MAX_DELIVER"} {
		if err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s not reported: %v", name, err)
		}
	}
}

// The lock Redis takes the main Redis's shapes (one server, a Cluster,
// Sentinels) and is refused at start, naming its variable, when an address
// has no port or a Sentinel master name comes without Sentinels.
func TestLockRedis(t *testing.T) {
	c, err := Load(env(map[string]string{"SHOP_ENV": "dev"}))
	if err != nil || len(c.LockRedisAddrs) != 0 || !c.LocksOnEmbeddedRedis() {
		t.Fatalf("unset: %v %v, on the embedded Redis %t; want the main Redis's", c.LockRedisAddrs, err, c.LocksOnEmbeddedRedis())
	}
	for v, want := range map[string]int{"locks:6379": 1, "l1:7000, l2:7000,l3:7000": 3} {
		c, err := Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_LOCK_REDIS_ADDRS": v}))
		if err != nil || len(c.LockRedisAddrs) != want || c.LocksOnEmbeddedRedis() {
			t.Errorf("SHOP_LOCK_REDIS_ADDRS=%q: %q, %v; want %d addresses off the embedded Redis", v, c.LockRedisAddrs, err, want)
		}
	}
	c, err = Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_LOCK_REDIS_ADDRS": "s1:26379,s2:26379",
		"SHOP_LOCK_REDIS_SENTINEL_MASTER": "locks"}))
	if err != nil || c.LockRedisSentinelMaster != "locks" {
		t.Errorf("Sentinels: %+v, %v", c, err)
	}
	for name, vars := range map[string]map[string]string{
		"SHOP_LOCK_REDIS_ADDRS":           {"SHOP_LOCK_REDIS_ADDRS": "locks"},
		"SHOP_LOCK_REDIS_SENTINEL_MASTER": {"SHOP_LOCK_REDIS_SENTINEL_MASTER": "locks"},
	} {
		vars["SHOP_ENV"] = "dev"
		if _, err := Load(env(vars)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: %v, want refused naming %s", vars, err, name)
		}
	}
}

// Only backend redis keeps its locks in the main Redis: with another
// backend nothing locks on the embedded server, whose fences it could
// forget.
func TestLocksOnEmbeddedRedisOnlyForBackendRedis(t *testing.T) {
	c, err := Load(env(map[string]string{"SHOP_ENV": "dev", "SHOP_LOCK_BACKEND": "local"}))
	if err != nil || c.LocksOnEmbeddedRedis() {
		t.Errorf("backend local: %t, %v", c.LocksOnEmbeddedRedis(), err)
	}
}

func TestDialAddressesAndLockTTLTheServersWouldRefuse(t *testing.T) {
	for name, vars := range map[string]map[string]string{
		"port out of range": {"SHOP_REDIS_ADDRS": "127.0.0.1:99999"},
		"port zero":         {"SHOP_REDIS_ADDRS": "127.0.0.1:6379,127.0.0.1:0"},
		"port negative":     {"SHOP_REDIS_ADDRS": "127.0.0.1:-1"},
		"TTL under 1ms":     {"SHOP_LOCK_TTL": "1ns"},
	} {
		var variable string
		for v := range vars {
			variable = v
		}
		vars["SHOP_ENV"] = "dev"
		if _, err := Load(env(vars)); err == nil || !strings.Contains(err.Error(), variable) {
			t.Errorf("%s: %v, want an error naming %s", name, err, variable)
		}
	}
}
