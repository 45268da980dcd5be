package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/lockbench/shop/internal/lockkit/registry"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// A registered backend that the runner does not run, or whose server its
// instances are not pointed at, would never be load-tested.
func TestRunnerCoversEveryBackend(t *testing.T) {
	env := map[string]string{
		"SHOP_TEST_MYSQL_DSN":           "root:@tcp(127.0.0.1:3306)/?parseTime=true",
		"SHOP_TEST_REDIS_CLUSTER_ADDRS": "127.0.0.1:7000",
	}
	for _, b := range registry.Backends() {
		if b.Server.TestEnv != "" && !b.Server.Store {
			env[b.Server.TestEnv] = "127.0.0.1:1"
		}
	}
	e, err := loadTestEnv(func(name string) string { return env[name] })
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]bool{}
	r := runner{env: e}.newRow(report.Row{})
	for _, kv := range r.shopEnv(0) {
		name, _, _ := strings.Cut(kv, "=")
		set[name] = true
	}
	for _, b := range registry.Backends() {
		if !slices.Contains(allRows, b.Name) {
			t.Errorf("backend %s is not a row of -backends all", b.Name)
		}
		if b.Capabilities.CrossProcess != slices.Contains(capacityRows, b.Name) {
			t.Errorf("backend %s: in -capacity all = %v, want %v (it excludes across processes)",
				b.Name, !b.Capabilities.CrossProcess, b.Capabilities.CrossProcess)
		}
		if s := b.Server.Setting; s != "" && !set[s] {
			t.Errorf("backend %s: the instances get no %s", b.Name, s)
		}
		// Several instances: only a lock that holds across processes may
		// be expected clean.
		s := baseSpec(b.Name, 3)
		if s.Backend != b.Name || s.Strategy != "lock" {
			t.Errorf("row %s runs backend %q with strategy %q", b.Name, s.Backend, s.Strategy)
		}
		if clean := s.Expect == report.ExpectClean; clean != b.Capabilities.CrossProcess {
			t.Errorf("row %s expects %s across 3 instances, but CrossProcess is %v", b.Name, s.Expect, b.Capabilities.CrossProcess)
		}
	}
}

func TestLoadTestEnvNamesEveryMissingServer(t *testing.T) {
	_, err := loadTestEnv(func(string) string { return "" })
	if err == nil {
		t.Fatal("an empty environment was accepted")
	}
	for _, srv := range lockServers() {
		if !strings.Contains(err.Error(), srv.TestEnv) {
			t.Errorf("error %q does not name %s", err, srv.TestEnv)
		}
	}
}

// The rows the report marks "no fence" are the locks across processes
// whose grant carries no token (Fence() == 0), read from the registry.
func TestRowsWithoutAFenceAreTheLocksThatIssueNone(t *testing.T) {
	want := map[string]bool{"redlock": true, "memcached": true}
	for _, name := range append(slices.Clone(allRows), "redis+combined") {
		if got := baseSpec(name, 3).NoFence; got != want[name] {
			t.Errorf("row %s: no fence = %v, want %v", name, got, want[name])
		}
	}
}
