package main

import (
	"strings"
	"testing"
	"time"

	"github.com/lockbench/shop/loadtest/runner/report"
)

// envMap is an environment as a map; a variable set twice is an error,
// since which of the two a process reads is up to it.
func envMap(t *testing.T, env []string) map[string]string {
	t.Helper()
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if _, twice := m[k]; twice {
			t.Errorf("%s is set twice", k)
		}
		m[k] = v
	}
	return m
}

// A SHOP_* variable left in the runner's shell must not change a row:
// the row's own settings are the only ones its instances see.
func TestShopEnvReplacesTheCallersShopSettingsWithTheRows(t *testing.T) {
	t.Setenv("SHOP_LOCK_BACKEND", "etcd")
	t.Setenv("SHOP_MYSQL_DSN", "root:@tcp(127.0.0.1:3306)/production")
	t.Setenv("RUNNER_TEST_KEPT", "yes")
	r := runner{env: testEnv{cluster: "127.0.0.1:17001", lockServers: []string{"SHOP_ETCD_ENDPOINTS=127.0.0.1:12379"}}}.
		newRow(rowSpec("redis", 3, allFlows))
	r.db = rowDB{name: "shop_lt_1_redis", dsn: "root:@tcp(127.0.0.1:3306)/shop_lt_1_redis"}
	env := envMap(t, r.shopEnv(4100))
	want := map[string]string{
		"SHOP_LOCK_BACKEND":   "redis",
		"SHOP_MYSQL_DSN":      r.db.dsn,
		"SHOP_HTTP_ADDR":      "127.0.0.1:4100",
		"SHOP_METRICS_ADDR":   "127.0.0.1:4100",
		"SHOP_REDIS_ADDRS":    "127.0.0.1:17001",
		"SHOP_ETCD_ENDPOINTS": "127.0.0.1:12379",
		"SHOP_KEY_PREFIX":     r.keyPrefix(),
		"SHOP_JWT_SECRET":     r.sec.jwt,
		"SHOP_ADMIN_TOKEN":    r.sec.admin,
		"RUNNER_TEST_KEPT":    "yes",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}
	if _, ok := env["SHOP_NATS_URL"]; ok {
		t.Error("a row without events is given a broker")
	}
}

// The settings that follow from the row's name and the run's options.
func TestShopEnvCarriesTheRowsStrategyAndTheRunsOptions(t *testing.T) {
	var o options
	o.Delay, o.Probe.SLO = 10*time.Millisecond, 250*time.Millisecond
	cases := []struct {
		row  string
		want map[string]string
	}{
		{"redis", map[string]string{"SHOP_STOCK_STRATEGY": "lock", "SHOP_BALANCE_STRATEGY": "lock", "SHOP_STOCK_COMBINE": "0"}},
		{"redis+combined", map[string]string{"SHOP_LOCK_BACKEND": "redis", "SHOP_STOCK_COMBINE": "32"}},
		{"optimistic", map[string]string{"SHOP_LOCK_BACKEND": "none", "SHOP_STOCK_STRATEGY": "optimistic", "SHOP_BALANCE_STRATEGY": "optimistic"}},
		{"atomic-sql", map[string]string{"SHOP_STOCK_STRATEGY": "atomic-sql", "SHOP_BALANCE_STRATEGY": "lock"}},
	}
	for _, c := range cases {
		r := runner{o: o}.newRow(rowSpec(c.row, 3, allFlows))
		env := envMap(t, r.shopEnv(1))
		c.want["SHOP_CRITICAL_SECTION_DELAY"] = "10ms"
		c.want["SHOP_LOCK_WAIT_TIMEOUT"] = "150ms" // 60 % of the SLO
		for k, v := range c.want {
			if env[k] != v {
				t.Errorf("%s: %s=%q, want %q", c.row, k, env[k], v)
			}
		}
	}
}

func TestAnEventsRowsInstancesGetItsBroker(t *testing.T) {
	r := runner{}.newRow(rowSpec("events-none", 3, allFlows))
	r.events = &eventRig{broker: &broker{port: 4333}}
	env := envMap(t, r.shopEnv(1))
	if env["SHOP_NATS_URL"] != "nats://127.0.0.1:4333" || env["SHOP_EVENTS_DEDUP"] != report.DedupNone {
		t.Errorf("broker %q, dedup %q", env["SHOP_NATS_URL"], env["SHOP_EVENTS_DEDUP"])
	}
}
