package main

import (
	"os"
	"strconv"
	"strings"

	"github.com/lockbench/shop/loadtest/runner/report"
)

// shopEnv is the environment of the row's shop process that listens on
// port: the caller's environment without any SHOP_* variable (a stray
// SHOP_LOCK_BACKEND in a shell must not change a row), plus the row's
// settings, and an events row's once its broker runs.
func (r *row) shopEnv(port int) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHOP_") {
			env = append(env, kv)
		}
	}
	env = append(env, r.env.lockServers...)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	env = append(env,
		"SHOP_ENV=production",
		// The run starts from a reset; the instances stop at once between rows.
		"SHOP_ALLOW_RESET=true",
		"SHOP_DRAIN_DELAY=0",
		// Short enough that the orders flow's unpaid orders are closed
		// within a row's run, so closer races (and none's damage) show.
		"SHOP_ORDER_PAY_TIMEOUT=5s",
		// k6's buyers order far faster than people do; the cap on units
		// held unpaid is not what a row measures.
		"SHOP_ORDER_MAX_UNPAID_UNITS=1000",
		"SHOP_HTTP_ADDR="+addr,
		// The runner reads each instance's /metrics from its API address;
		// the default loopback port would be shared by the instances.
		"SHOP_METRICS_ADDR="+addr,
		"SHOP_LOCK_BACKEND="+r.spec.Backend,
		"SHOP_STOCK_STRATEGY="+r.spec.Strategy,
		"SHOP_CRITICAL_SECTION_DELAY="+r.o.Delay.String(),
		"SHOP_MYSQL_DSN="+r.db.dsn,
		// MariaDB allows 151 connections to everyone sharing it. Each
		// instance opens this many, and mysql-forupdate up to 32 more of
		// its own (one pinned per waiter): 3 x (8 + 32) leaves room for
		// the other tests running against the same server.
		"SHOP_DB_MAX_CONNS=8",
		"SHOP_REDIS_ADDRS="+r.env.cluster,
		"SHOP_KEY_PREFIX="+r.keyPrefix(),
		"SHOP_JWT_SECRET="+r.sec.jwt,
		"SHOP_ADMIN_TOKEN="+r.sec.admin,
		"SHOP_LOG_LEVEL=warn",
		"SHOP_SHUTDOWN_TIMEOUT=5s",
		"SHOP_BALANCE_STRATEGY="+balanceStrategy(r.spec),
		"SHOP_STOCK_COMBINE="+strconv.Itoa(r.spec.Combine),
		// A buyer waits for a lock at most 60 % of the latency SLO: past
		// that it is turned away (503 lock-busy), so that the buyers who
		// get through keep their p99 within the SLO under overload.
		"SHOP_LOCK_WAIT_TIMEOUT="+(r.o.Probe.SLO*3/5).String(),
	)
	if r.events != nil {
		env = append(env, eventsEnv(r.spec, r.events.broker.url())...)
	}
	return env
}

// keyPrefix is the row's own prefix of keys: lock keys and fence counters
// of another run or row (or another engineer's tests) never meet this
// row's.
func (r *row) keyPrefix() string { return "lt" + runID() + "-" + r.spec.Name + ":" }

func balanceStrategy(s report.Row) string {
	if s.Strategy == "optimistic" {
		return "optimistic"
	}
	return "lock"
}
