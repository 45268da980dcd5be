package main

import (
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"
)

// testEnv are the servers scripts/testenv.sh starts, from the SHOP_TEST_*
// variables of /tmp/shop-testenv/env.
type testEnv struct {
	mariadb mariadb
	cluster string
	// natsServer is the nats-server binary the events rows start
	// (SHOP_TEST_NATS_SERVER), checked when such a row starts.
	natsServer string
	// lockServers are the SHOP_* settings of every registered backend's
	// server that is not one of shop's own stores, each set to its
	// SHOP_TEST_* address: every instance gets them all, so that any row
	// can run.
	lockServers []string
}

func loadTestEnv(getenv func(string) string) (testEnv, error) {
	e := testEnv{
		cluster:    getenv("SHOP_TEST_REDIS_CLUSTER_ADDRS"),
		natsServer: getenv("SHOP_TEST_NATS_SERVER"),
	}
	dsn := getenv("SHOP_TEST_MYSQL_DSN")
	vars := map[string]string{"SHOP_TEST_MYSQL_DSN": dsn, "SHOP_TEST_REDIS_CLUSTER_ADDRS": e.cluster}
	addrs := []string{e.cluster}
	for _, srv := range lockServers() {
		v := getenv(srv.TestEnv)
		vars[srv.TestEnv] = v
		addrs = append(addrs, v)
		e.lockServers = append(e.lockServers, srv.Setting+"="+v)
	}
	var missing []string
	for name, v := range vars {
		if v == "" {
			missing = append(missing, name)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return e, fmt.Errorf("%s unset: run `scripts/testenv.sh up && source /tmp/shop-testenv/env` first (make loadtest does)",
			strings.Join(missing, ", "))
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return e, fmt.Errorf("SHOP_TEST_MYSQL_DSN: %w", err)
	}
	e.mariadb = mariadb{cfg: cfg}
	// Every address must be on loopback: the load test never leaves the
	// machine it runs on.
	for _, list := range append(addrs, cfg.Addr) {
		for _, a := range strings.Split(list, ",") {
			if err := loopback(a); err != nil {
				return e, err
			}
		}
	}
	return e, nil
}

func loopback(addr string) error {
	addr = strings.TrimPrefix(strings.TrimPrefix(strings.TrimSpace(addr), "http://"), "https://")
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("address %q is not on loopback; the load test only targets this machine", addr)
	}
	return nil
}
