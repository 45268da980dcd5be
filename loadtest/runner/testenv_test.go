package main

import (
	"strings"
	"testing"

	"github.com/lockbench/shop/internal/lockkit/registry"
)

// servers is a complete test environment on loopback, with some values
// replaced.
func servers(replace map[string]string) func(string) string {
	env := map[string]string{
		"SHOP_TEST_MYSQL_DSN":           "root:@tcp(127.0.0.1:3306)/?parseTime=true",
		"SHOP_TEST_REDIS_CLUSTER_ADDRS": "127.0.0.1:17001,127.0.0.1:17002",
		"SHOP_TEST_NATS_SERVER":         "/usr/bin/nats-server",
	}
	for _, b := range registry.Backends() {
		if b.Server.TestEnv != "" && !b.Server.Store {
			env[b.Server.TestEnv] = "localhost:1"
		}
	}
	for k, v := range replace {
		env[k] = v
	}
	return func(name string) string { return env[name] }
}

func TestLoadTestEnvReadsTheServers(t *testing.T) {
	e, err := loadTestEnv(servers(nil))
	if err != nil {
		t.Fatal(err)
	}
	if e.mariadb.cfg.Addr != "127.0.0.1:3306" || e.cluster != "127.0.0.1:17001,127.0.0.1:17002" || e.natsServer != "/usr/bin/nats-server" {
		t.Errorf("read %+v", e)
	}
	if len(e.lockServers) != len(lockServers()) {
		t.Errorf("lock servers %v, want one per setting", e.lockServers)
	}
}

// The load test never leaves the machine: an address elsewhere, in any
// list or in the DSN, stops the run before it starts anything.
func TestLoadTestEnvRefusesAnAddressOffLoopback(t *testing.T) {
	cases := map[string]map[string]string{
		"a cluster node": {"SHOP_TEST_REDIS_CLUSTER_ADDRS": "127.0.0.1:17001,10.0.0.7:17002"},
		"the database":   {"SHOP_TEST_MYSQL_DSN": "root:@tcp(db.example.com:3306)/"},
	}
	for _, srv := range lockServers() {
		cases[srv.TestEnv] = map[string]string{srv.TestEnv: "192.168.1.2:1"}
	}
	for name, replace := range cases {
		if _, err := loadTestEnv(servers(replace)); err == nil || !strings.Contains(err.Error(), "not on loopback") {
			t.Errorf("%s off loopback: %v", name, err)
		}
	}
}

func TestLoadTestEnvRefusesADSNItCannotRead(t *testing.T) {
	_, err := loadTestEnv(servers(map[string]string{"SHOP_TEST_MYSQL_DSN": "not a dsn"}))
	if err == nil || !strings.Contains(err.Error(), "SHOP_TEST_MYSQL_DSN") {
		t.Errorf("error %v, want it to name SHOP_TEST_MYSQL_DSN", err)
	}
}

func TestLoopbackAcceptsTheLoopbackNamesAndURLs(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:1", "localhost:6379", "[::1]:2379", " http://127.0.0.1:2379", "https://127.0.0.2:1"} {
		if err := loopback(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"10.0.0.1:1", "example.com:80", "127.0.0.1", ""} {
		if err := loopback(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}
