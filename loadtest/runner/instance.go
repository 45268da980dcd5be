package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/lockbench/shop/loadtest/runner/report"
)

// testEnv are the servers scripts/testenv.sh starts, from the SHOP_TEST_*
// variables of /tmp/shop-testenv/env.
type testEnv struct {
	mysqlDSN string
	cluster  string
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
		mysqlDSN:   getenv("SHOP_TEST_MYSQL_DSN"),
		cluster:    getenv("SHOP_TEST_REDIS_CLUSTER_ADDRS"),
		natsServer: getenv("SHOP_TEST_NATS_SERVER"),
	}
	vars := map[string]string{"SHOP_TEST_MYSQL_DSN": e.mysqlDSN, "SHOP_TEST_REDIS_CLUSTER_ADDRS": e.cluster}
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
	// Every address must be on loopback: the load test never leaves the
	// machine it runs on.
	for _, list := range addrs {
		for _, a := range strings.Split(list, ",") {
			if err := loopback(a); err != nil {
				return e, err
			}
		}
	}
	cfg, err := mysql.ParseDSN(e.mysqlDSN)
	if err != nil {
		return e, fmt.Errorf("SHOP_TEST_MYSQL_DSN: %w", err)
	}
	if err := loopback(cfg.Addr); err != nil {
		return e, err
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

// database creates a fresh MariaDB database for one row: fences start at 0
// and no row of another backend's run (whose fences came from another
// counter) can refuse this run's writes.
func (e testEnv) database(ctx context.Context, name string) (dsn string, drop func(context.Context) error, err error) {
	cfg, err := mysql.ParseDSN(e.mysqlDSN)
	if err != nil {
		return "", nil, err
	}
	cfg.DBName = ""
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return "", nil, err
	}
	defer db.Close()
	// name is built from [a-z0-9_] only (dbName), so quoting is enough.
	if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
		return "", nil, fmt.Errorf("drop database %s: %w", name, err)
	}
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		return "", nil, fmt.Errorf("create database %s: %w", name, err)
	}
	base := cfg.FormatDSN()
	cfg.DBName = name
	drop = func(ctx context.Context) error {
		db, err := sql.Open("mysql", base)
		if err != nil {
			return err
		}
		defer db.Close()
		_, err = db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`")
		return err
	}
	return cfg.FormatDSN(), drop, nil
}

// sweep drops the databases of earlier runs whose runner is gone (killed
// before it could drop them), so that interrupted runs do not pile up on a
// server others use. A live runner's databases are left alone.
func (e testEnv) sweep(ctx context.Context) error {
	cfg, err := mysql.ParseDSN(e.mysqlDSN)
	if err != nil {
		return err
	}
	cfg.DBName = ""
	db, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		return err
	}
	defer db.Close()
	rows, err := db.QueryContext(ctx, `SHOW DATABASES LIKE 'shop\_lt\_%'`)
	if err != nil {
		return err
	}
	var stale []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			rows.Close()
			return err
		}
		pid, _, _ := strings.Cut(strings.TrimPrefix(name, "shop_lt_"), "_")
		if n, err := strconv.Atoi(pid); err == nil && n != os.Getpid() && !alive(n) {
			stale = append(stale, name)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	for _, name := range stale {
		if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			return err
		}
	}
	return nil
}

// alive reports whether a process pid exists (signal 0 checks, sends
// nothing).
func alive(pid int) bool {
	p, err := os.FindProcess(pid)
	return err == nil && p.Signal(syscall.Signal(0)) == nil
}

func dbName(runID, row string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(row) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteRune('_')
		}
	}
	return "shop_lt_" + runID + "_" + b.String()
}

// secrets are one run's credentials: random, so that nothing minted for a
// load test is accepted anywhere else.
type secrets struct {
	jwt, admin string
}

func newSecrets() secrets {
	return secrets{jwt: randomHex(32), admin: randomHex(24)}
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // crypto/rand.Read never fails on Linux (Go 1.24+ panics instead)
	return hex.EncodeToString(b)
}

// shopEnv is the environment of one instance: the caller's environment
// without any SHOP_* variable (a stray SHOP_LOCK_BACKEND in a shell must
// not change a row), plus the row's settings.
func shopEnv(o options, e testEnv, s report.Row, sec secrets, dsn, prefix, addr string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHOP_") {
			env = append(env, kv)
		}
	}
	env = append(env, e.lockServers...)
	return append(env,
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
		"SHOP_LOCK_BACKEND="+s.Backend,
		"SHOP_STOCK_STRATEGY="+s.Strategy,
		"SHOP_CRITICAL_SECTION_DELAY="+o.Delay.String(),
		"SHOP_MYSQL_DSN="+dsn,
		// MariaDB allows 151 connections to everyone sharing it. Each
		// instance opens this many, and mysql-forupdate up to 32 more of
		// its own (one pinned per waiter): 3 x (8 + 32) leaves room for
		// the other tests running against the same server.
		"SHOP_DB_MAX_CONNS=8",
		"SHOP_REDIS_ADDRS="+e.cluster,
		"SHOP_KEY_PREFIX="+prefix,
		"SHOP_JWT_SECRET="+sec.jwt,
		"SHOP_ADMIN_TOKEN="+sec.admin,
		"SHOP_LOG_LEVEL=warn",
		"SHOP_SHUTDOWN_TIMEOUT=5s",
		"SHOP_BALANCE_STRATEGY="+balanceStrategy(s),
		"SHOP_STOCK_COMBINE="+strconv.Itoa(s.Combine),
		// A buyer waits for a lock at most 60 % of the latency SLO: past
		// that it is turned away (503 lock-busy), so that the buyers who
		// get through keep their p99 within the SLO under overload.
		"SHOP_LOCK_WAIT_TIMEOUT="+(o.Probe.SLO*3/5).String(),
	)
}

func balanceStrategy(s report.Row) string {
	if s.Strategy == "optimistic" {
		return "optimistic"
	}
	return "lock"
}

// instance is one running shop process.
type instance struct {
	url  string
	p    process
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{} // closed when the process has exited
	err  error         // its exit error, valid after done
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before shop binds it; start then fails clearly and the row is
// reported as not run.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// migrate runs `shop migrate` once, so that the instances do not race to
// create the same tables.
func migrate(ctx context.Context, shop string, env []string, logPath string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, shop, "migrate")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	_ = os.WriteFile(logPath, out, 0o644)
	if err != nil {
		return fmt.Errorf("shop migrate: %w: %s", err, tail(out))
	}
	return nil
}

// process is how to start one shop process, kept so that the runner can
// start it again after killing it.
type process struct {
	shop, command string // the binary and its sub-command: serve, consume
	env           []string
	port          int
	logPath       string
}

func startInstance(shop string, env []string, port int, logPath string) (*instance, error) {
	return process{shop: shop, command: "serve", env: env, port: port, logPath: logPath}.start(os.O_TRUNC)
}

// start runs the process; logFlag is os.O_TRUNC the first time,
// os.O_APPEND after a restart.
func (p process) start(logFlag int) (*instance, error) {
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|logFlag, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(p.shop, p.command)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	in := &instance{url: "http://127.0.0.1:" + strconv.Itoa(p.port), p: p, cmd: cmd, log: f, done: make(chan struct{})}
	go func() {
		in.err = cmd.Wait()
		close(in.done)
	}()
	return in, nil
}

// restart SIGKILLs the process, as a crash would, starts it again with the
// same settings and waits until it is ready.
func (in *instance) restart(ctx context.Context) (*instance, error) {
	_ = in.cmd.Process.Kill()
	<-in.done
	in.log.Close()
	again, err := in.p.start(os.O_APPEND)
	if err != nil {
		return in, err // dead, as it was killed; stop still works
	}
	return again, again.waitReady(ctx, 60*time.Second)
}

// waitReady polls /readyz until it answers 200, the process exits, or
// the deadline passes.
func (in *instance) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, in.url+"/readyz", nil)
		if res, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-in.done:
			return fmt.Errorf("%s exited before it was ready (%v); see %s", in.url, in.err, in.log.Name())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s; see %s", in.url, timeout, in.log.Name())
		case <-tick.C:
		}
	}
}

// stop sends SIGTERM, lets shop drain (SHOP_SHUTDOWN_TIMEOUT=5s), and
// kills it if it is still there after grace.
func (in *instance) stop(grace time.Duration) {
	_ = in.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-in.done:
	case <-time.After(grace):
		_ = in.cmd.Process.Kill()
		<-in.done
	}
	in.log.Close()
}

// admin calls the admin API of one instance.
type admin struct {
	url, token string
}

func (a admin) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, a.url+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+a.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return err
	}
	if res.StatusCode/100 != 2 {
		return fmt.Errorf("%s %s: %s: %s", method, path, res.Status, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// auditReport reads GET /admin/v1/audit: {"ok":…, "<check>":{"total":n,…}}.
func (a admin) audit(ctx context.Context, rawPath string) (ok bool, totals map[string]int64, err error) {
	var raw map[string]json.RawMessage
	if err := a.do(ctx, http.MethodGet, "/admin/v1/audit", nil, &raw); err != nil {
		return false, nil, err
	}
	if b, err := json.MarshalIndent(raw, "", "  "); err == nil {
		_ = os.WriteFile(rawPath, b, 0o644)
	}
	if err := json.Unmarshal(raw["ok"], &ok); err != nil {
		return false, nil, fmt.Errorf("audit: no ok member: %w", err)
	}
	totals = map[string]int64{}
	for name, v := range raw {
		var d struct {
			Total *int64 `json:"total"`
		}
		if json.Unmarshal(v, &d) == nil && d.Total != nil {
			totals[name] = *d.Total
		}
	}
	if len(totals) == 0 {
		return ok, nil, errors.New("audit: no checks in the answer")
	}
	return ok, totals, nil
}

func tail(b []byte) string {
	const n = 2000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

func logPath(out, row, what string) string {
	return filepath.Join(out, "logs", row+"-"+what+".log")
}
