package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// testRunner starts this test binary for shop, k6 and the ceiling, and
// writes its output to a directory of the test's.
func testRunner(t *testing.T) runner {
	t.Helper()
	rn := quietRunner()
	rn.o.shop, rn.o.k6, rn.o.out = os.Args[0], os.Args[0], t.TempDir()
	rn.o.Instances, rn.o.Users, rn.o.Stock = 2, 300, 50
	if err := os.MkdirAll(filepath.Join(rn.o.out, "logs"), 0o755); err != nil {
		t.Fatal(err)
	}
	return rn
}

// fakeRunner runs its rows' instances as fake shops, against the real
// MariaDB: every row gets a real database of its own.
func fakeRunner(t *testing.T) runner {
	t.Helper()
	rn := testRunner(t)
	rn.env = testEnv{mariadb: testMariaDB(t), cluster: "127.0.0.1:1"}
	t.Setenv("RUNNER_FAKE", "shop")
	return rn
}

func exited(in *instance) bool {
	select {
	case <-in.done:
		return true
	default:
		return false
	}
}

// A started row has a database of its own, migrated; every instance
// ready, configured with the row's secrets; the fixture laid down; and
// the users' tokens for k6. Closed, it leaves no process, database or
// token file behind.
func TestAStartedRowHasItsWorldAndCloseLeavesNothingBehind(t *testing.T) {
	rn := fakeRunner(t)
	r := rn.newRow(rowSpec("redis", rn.o.Instances, allFlows))
	if err := r.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.close)
	if !slices.Contains(databases(t, rn.env.mariadb), r.db.name) {
		t.Errorf("no database %s", r.db.name)
	}
	if log := logOf(t, r.logPath("migrate")); !strings.Contains(log, "migrated "+r.db.dsn) {
		t.Errorf("migrate log %q: not run on the row's database", log)
	}
	if len(r.instances) != 2 || len(r.urls) != 2 || r.urls[0] == r.urls[1] {
		t.Fatalf("instances at %v, want two on ports of their own", r.urls)
	}
	// The fake answers the admin calls only with the row's admin token.
	setUp := logOf(t, r.logPath("shop1"))
	for _, want := range []string{`/admin/v1/reset {"fixture":"loadtest"}`, `"sku":"lt-hot"`, `"stock":50`, `"sku":"lt-order"`} {
		if !strings.Contains(setUp, want) {
			t.Errorf("shop1 log lacks %s:\n%s", want, setUp)
		}
	}
	var tokens []struct {
		User  int64  `json:"user"`
		Token string `json:"token"`
	}
	b, err := os.ReadFile(r.tokens)
	if err == nil {
		err = json.Unmarshal(b, &tokens)
	}
	if err != nil || len(tokens) != rn.o.Users {
		t.Fatalf("tokens file: %d tokens, %v", len(tokens), err)
	}
	if user, err := auth.New([]byte(r.sec.jwt), r.sec.admin).Verify(tokens[299].Token); err != nil || user != 300 {
		t.Errorf("last token is user %d (%v), want 300 signed with the row's secret", user, err)
	}

	r.close()
	for i, in := range r.instances {
		if !exited(in) || in.err != nil {
			t.Errorf("instance %d after close: exited %v, %v", i+1, exited(in), in.err)
		}
	}
	if slices.Contains(databases(t, rn.env.mariadb), r.db.name) {
		t.Errorf("database %s left after close", r.db.name)
	}
	if _, err := os.Stat(r.tokens); !os.IsNotExist(err) {
		t.Errorf("tokens file left after close: %v", err)
	}
}

// Two rows of one run never share keys or credentials.
func TestRowsHaveTheirOwnSecretsDatabaseAndKeys(t *testing.T) {
	rn := runner{}
	a, b := rn.newRow(report.Row{Name: "redis"}), rn.newRow(report.Row{Name: "etcd"})
	if a.sec == b.sec || a.sec.jwt == "" || a.sec.admin == "" {
		t.Errorf("secrets %+v and %+v", a.sec, b.sec)
	}
	if a.keyPrefix() == b.keyPrefix() || !strings.HasPrefix(a.keyPrefix(), "lt"+runID()+"-") {
		t.Errorf("key prefixes %q and %q", a.keyPrefix(), b.keyPrefix())
	}
	if dbName(runID(), a.spec.Name) == dbName(runID(), b.spec.Name) {
		t.Error("two rows share a database name")
	}
}

// A row that fails to start undoes what it did: no instance left running,
// no database left on the shared server.
func TestARowWhoseInstanceCannotStartLeavesNothingBehind(t *testing.T) {
	rn := fakeRunner(t)
	t.Setenv("RUNNER_FAKE_SERVE", "exit")
	r := rn.newRow(rowSpec("redis", rn.o.Instances, allFlows))
	err := r.start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready") {
		t.Fatalf("start: %v, want the instance's exit", err)
	}
	for i, in := range r.instances {
		if !exited(in) {
			t.Errorf("instance %d still running", i+1)
		}
	}
	if slices.Contains(databases(t, rn.env.mariadb), r.db.name) {
		t.Errorf("database %s left after a failed start", r.db.name)
	}
}

func TestARowWhoseMigrationFailsSaysWhyAndStartsNoInstance(t *testing.T) {
	rn := fakeRunner(t)
	t.Setenv("RUNNER_FAKE_MIGRATE", "fail")
	r := rn.newRow(rowSpec("redis", rn.o.Instances, allFlows))
	err := r.start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "shop migrate") || !strings.Contains(err.Error(), "unknown database") {
		t.Fatalf("start: %v, want migrate's error and output", err)
	}
	if len(r.instances) != 0 {
		t.Errorf("%d instances started on an unmigrated database", len(r.instances))
	}
	if log := logOf(t, r.logPath("migrate")); !strings.Contains(log, "unknown database") {
		t.Errorf("migrate log %q", log)
	}
}

// -keep leaves each row's database for inspection.
func TestKeepLeavesTheRowsDatabase(t *testing.T) {
	rn := fakeRunner(t)
	rn.o.keep, rn.o.Instances = true, 1
	r := rn.newRow(rowSpec("redis", 1, allFlows))
	if err := r.start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rn.env.mariadb.drop(context.Background(), r.db.name) })
	r.close()
	if !slices.Contains(databases(t, rn.env.mariadb), r.db.name) {
		t.Errorf("database %s dropped despite -keep", r.db.name)
	}
}
