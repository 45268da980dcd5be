// Package shoptest starts real shop processes and the test resources they
// need (a private MySQL database, a unique Redis key prefix), for tests that
// prove what only several processes can show.
//
// Servers come from the SHOP_TEST_* variables that scripts/testenv.sh
// writes. Without one, a test skips with the reason, except under CI=true,
// where it fails: CI never skips.
package shoptest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/testenv"
)

// Env returns the variable name, or skips the test (fails it under CI=true)
// when it is unset.
func Env(t testing.TB, name string) string { return testenv.Require(t, name) }

// Random returns n random bytes as hex.
func Random(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Prefix returns a Redis key prefix no other test uses.
func Prefix(pkg string) string { return "shoptest:" + pkg + ":" + Random(4) + ":" }

// MySQL creates a database shop_test_<random> on SHOP_TEST_MYSQL_DSN, drops
// it when the test ends, and returns a DSN for it.
func MySQL(t testing.TB) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(Env(t, "SHOP_TEST_MYSQL_DSN"))
	if err != nil {
		t.Fatalf("SHOP_TEST_MYSQL_DSN: %v", err)
	}
	name := "shop_test_" + Random(6)
	root, err := gorm.Open(gormmysql.Open(cfg.FormatDSN()), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatalf("mysql: %v", err)
	}
	sqlDB, _ := root.DB()
	if err := root.Exec("CREATE DATABASE " + name).Error; err != nil {
		sqlDB.Close()
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		if err := root.Exec("DROP DATABASE " + name).Error; err != nil {
			t.Errorf("drop database %s: %v", name, err)
		}
		sqlDB.Close()
	})
	cfg.DBName = name
	cfg.ParseTime = true
	return cfg.FormatDSN()
}

// Token mints a user token with secret.
func Token(t testing.TB, secret string, user int64) string {
	t.Helper()
	tok, err := auth.New([]byte(secret), "").Token(user, time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

var build struct {
	once sync.Once
	dir  string
	bin  string
	err  error
}

// Build compiles cmd/shop once per test binary, with the race detector when
// the test binary has it, and returns the executable's path. Call Cleanup
// from TestMain to remove it.
func Build(t testing.TB) string {
	t.Helper()
	build.once.Do(func() {
		build.dir, build.err = os.MkdirTemp("", "shoptest-bin-")
		if build.err != nil {
			return
		}
		build.bin = filepath.Join(build.dir, "shop")
		args := []string{"build", "-o", build.bin}
		if raceEnabled {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "github.com/lockbench/shop/cmd/shop")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			build.err = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if build.err != nil {
		t.Fatal(build.err)
	}
	return build.bin
}

// Cleanup removes what Build made.
func Cleanup() {
	if build.dir != "" {
		_ = os.RemoveAll(build.dir)
	}
}

// Instance is one running shop process.
type Instance struct {
	URL  string
	cmd  *exec.Cmd
	logs *lockedBuffer
	done chan struct{}
	err  error // the process's exit, once done is closed
}

// Start runs bin serve with env (plus SHOP_HTTP_ADDR=127.0.0.1:0, JSON
// logs, the reset allowed and no drain delay, unless given), waits until
// it listens, and stops it with SIGTERM when the test ends. Its logs are printed if the test failed.
func Start(t testing.TB, bin string, env map[string]string) *Instance {
	t.Helper()
	return StartCommand(t, bin, "serve", env)
}

// StartCommand is Start for another long-running command of bin (consume),
// which logs "listening" as serve does.
func StartCommand(t testing.TB, bin, command string, env map[string]string) *Instance {
	t.Helper()
	// Tests reset their data and stop instances often: no drain delay.
	full := map[string]string{"SHOP_HTTP_ADDR": "127.0.0.1:0", "SHOP_LOG_FORMAT": "json",
		"SHOP_ALLOW_RESET": "true", "SHOP_DRAIN_DELAY": "0"}
	for k, v := range env {
		full[k] = v
	}
	// /metrics on the API listener (the URL tests read it from) unless
	// the test says otherwise: the default loopback port would be shared
	// by every instance on the machine.
	if _, ok := full["SHOP_METRICS_ADDR"]; !ok {
		full["SHOP_METRICS_ADDR"] = full["SHOP_HTTP_ADDR"]
	}
	if _, ok := full["SHOP_NATS_URL"]; !ok {
		full["SHOP_NATS_URL"] = testenv.ServiceBroker(t)
	}
	cmd := exec.Command(bin, command)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.Getenv("HOME"), "TMPDIR=" + os.TempDir()}
	for k, v := range full {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	in := &Instance{cmd: cmd, logs: &lockedBuffer{}, done: make(chan struct{})}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		in.err = cmd.Wait()
		pw.Close()
		close(in.done)
	}()
	addr := make(chan string, 1)
	scanDone := make(chan struct{})
	go func() {
		defer close(scanDone)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Bytes()
			in.logs.Write(append(line, '\n'))
			var rec struct{ Msg, Addr string }
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "listening" {
				addr <- rec.Addr
			}
		}
		_, _ = io.Copy(io.Discard, pr)
	}()
	t.Cleanup(func() {
		in.Stop(t)
		<-scanDone
		if t.Failed() {
			t.Logf("logs of %s:\n%s", in.URL, in.logs.tail(60))
		}
	})
	select {
	case a := <-addr:
		in.URL = "http://" + a
	case <-in.done:
		t.Fatalf("shop exited before listening: %v\n%s", in.err, in.logs.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("shop did not listen within 60s\n%s", in.logs.String())
	}
	return in
}

// Signal sends sig to the process.
func (in *Instance) Signal(sig os.Signal) error { return in.cmd.Process.Signal(sig) }

// Wait waits for the process to exit and returns its exit error (nil for
// status 0).
func (in *Instance) Wait(ctx context.Context) error {
	select {
	case <-in.done:
		return in.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stop sends SIGTERM and waits up to 20 s, then kills.
func (in *Instance) Stop(t testing.TB) {
	select {
	case <-in.done:
		return
	default:
	}
	_ = in.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-in.done:
	case <-time.After(20 * time.Second):
		t.Errorf("shop %s ignored SIGTERM for 20s; killing it", in.URL)
		_ = in.cmd.Process.Kill()
		<-in.done
	}
}

// Logs returns what the process has printed so far.
func (in *Instance) Logs() string { return in.logs.String() }

type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *lockedBuffer) tail(n int) string {
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Client sends JSON requests to shop instances.
type Client struct {
	HTTP *http.Client
}

// NewClient returns a Client that keeps up to conns connections per host,
// so that a burst of concurrent requests is not queued in the client.
func NewClient(conns int) *Client {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConns = conns * 4
	tr.MaxIdleConnsPerHost = conns
	return &Client{HTTP: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
}

// Close closes idle connections.
func (c *Client) Close() { c.HTTP.CloseIdleConnections() }

// Response is an answer, read whole.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into v.
func (r Response) JSON(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decode %s: %v", r.Body, err)
	}
}

// Do sends method url with body (marshalled unless it is a string or
// []byte) and the bearer token, if any.
func (c *Client) Do(ctx context.Context, method, url, token string, body any) (Response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, err := json.Marshal(b)
		if err != nil {
			return Response{}, err
		}
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return Response{}, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := c.HTTP.Do(req)
	if err != nil {
		return Response{}, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return Response{Status: res.StatusCode, Header: res.Header, Body: b}, err
}

// Must is Do that fails the test on a transport error or a status other
// than want.
func (c *Client) Must(t testing.TB, want int, method, url, token string, body any) Response {
	t.Helper()
	r, err := c.Do(context.Background(), method, url, token, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	if r.Status != want {
		t.Fatalf("%s %s: status %d, want %d: %s", method, url, r.Status, want, r.Body)
	}
	return r
}
