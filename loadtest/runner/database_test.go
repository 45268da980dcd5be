package main

import (
	"context"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/lockbench/shop/internal/testenv"
)

// testMariaDB is the test servers' MariaDB.
func testMariaDB(t *testing.T) mariadb {
	t.Helper()
	cfg, err := mysql.ParseDSN(testenv.Require(t, "SHOP_TEST_MYSQL_DSN"))
	if err != nil {
		t.Fatal(err)
	}
	return mariadb{cfg: cfg}
}

// databases are the server's databases named like the runner's.
func databases(t *testing.T, m mariadb) []string {
	t.Helper()
	db, err := m.admin()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	names, err := column[string](context.Background(), db, `SHOW DATABASES LIKE 'shop\_lt\_%'`)
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// createForTest creates a database dropped at the end of the test.
func createForTest(t *testing.T, m mariadb, name string) rowDB {
	t.Helper()
	d, err := m.create(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.drop(context.Background(), name) })
	return d
}

// A row's database is new: nothing another row or run wrote (its tables,
// its fences) is in it, and its DSN opens it.
func TestCreateGivesARowAFreshDatabaseItsDSNOpens(t *testing.T) {
	m := testMariaDB(t)
	ctx := context.Background()
	name := dbName(runID(), "create-test")
	first := createForTest(t, m, name)
	db, err := first.open()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.ExecContext(ctx, "CREATE TABLE left_behind (id INT)"); err != nil {
		t.Fatal(err)
	}
	db.Close()

	again := createForTest(t, m, name)
	if again.name != name {
		t.Errorf("database %q, want %q", again.name, name)
	}
	db, err = again.open()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var current string
	if err := db.QueryRowContext(ctx, "SELECT DATABASE()").Scan(&current); err != nil || current != name {
		t.Errorf("the DSN opens %q (%v), want %q", current, err, name)
	}
	tables, err := column[string](ctx, db, "SHOW TABLES")
	if err != nil || len(tables) != 0 {
		t.Errorf("tables %v (%v) in a database created afresh", tables, err)
	}
}

// The admin connection chooses no database, whatever the DSN names: it
// must be able to drop the one the DSN names.
func TestAdminConnectsWithoutTheDSNsDatabase(t *testing.T) {
	m := testMariaDB(t)
	m.cfg = m.cfg.Clone()
	m.cfg.DBName = dbName(runID(), "not-created")
	db, err := m.admin()
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var current *string
	if err := db.QueryRowContext(context.Background(), "SELECT DATABASE()").Scan(&current); err != nil || current != nil {
		t.Errorf("admin connection on database %v (%v), want none", current, err)
	}
}

func TestDropRemovesTheDatabasesAndToleratesMissingOnes(t *testing.T) {
	m := testMariaDB(t)
	a, b := dbName(runID(), "drop-a"), dbName(runID(), "drop-b")
	createForTest(t, m, a)
	createForTest(t, m, b)
	if err := m.drop(context.Background(), a, b, dbName(runID(), "drop-never-created")); err != nil {
		t.Fatal(err)
	}
	if left := databases(t, m); slices.Contains(left, a) || slices.Contains(left, b) {
		t.Errorf("databases left after drop: %v", left)
	}
}

// deadPid is the pid of a process that has exited and been reaped.
func deadPid(t *testing.T) int {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "RUNNER_FAKE=exit")
	_ = cmd.Run()
	if alive(cmd.Process.Pid) {
		t.Fatalf("pid %d still exists after it exited", cmd.Process.Pid)
	}
	return cmd.Process.Pid
}

// An interrupted run's databases are dropped by the next run; a live
// run's, and this run's own, are not.
func TestSweepDropsOnlyTheDatabasesOfRunnersThatAreGone(t *testing.T) {
	m := testMariaDB(t)
	dead := dbName(strconv.Itoa(deadPid(t)), "sweep")
	live := dbName(strconv.Itoa(os.Getppid()), "sweep") // go test, waiting for this binary
	own := dbName(runID(), "sweep")
	notOurs := "shop_lt_notapid_sweep"
	for _, name := range []string{dead, live, own, notOurs} {
		createForTest(t, m, name)
	}
	if err := m.sweep(context.Background()); err != nil {
		t.Fatal(err)
	}
	left := databases(t, m)
	if slices.Contains(left, dead) {
		t.Errorf("%s, of a runner that is gone, was kept", dead)
	}
	for _, name := range []string{live, own, notOurs} {
		if !slices.Contains(left, name) {
			t.Errorf("%s was dropped", name)
		}
	}
}

// A row's name becomes a database name that needs no quoting beyond the
// backticks: the runner builds its DDL from it.
func TestDbNameKeepsOnlyLettersDigitsAndUnderscores(t *testing.T) {
	cases := map[string]string{
		"redis":            "shop_lt_42_redis",
		"mysql-forupdate":  "shop_lt_42_mysql_forupdate",
		"Redis+combined":   "shop_lt_42_redis_combined",
		"x`; DROP TABLE y": "shop_lt_42_x___drop_table_y",
	}
	for row, want := range cases {
		if got := dbName("42", row); got != want {
			t.Errorf("dbName(%q) = %q, want %q", row, got, want)
		}
	}
}
