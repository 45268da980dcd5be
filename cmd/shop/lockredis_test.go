package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/testenv"
)

// With SHOP_LOCK_REDIS_ADDRS the lock keys and fence counters land on that
// server and none on the main Redis; the tokens the stores keep are that
// server's, and they keep winning after an admin reset, which leaves the
// counters where they are (a reset never lowers a fence).
func TestLockKeysLiveOnTheLockRedis(t *testing.T) {
	main := shoptest.Env(t, "SHOP_TEST_REDIS_ADDR")
	locks := startRedis(t)
	prefix := shoptest.Prefix("lockredis")
	srv, a := newTestServer(t, map[string]string{"SHOP_REDIS_ADDRS": main, "SHOP_LOCK_REDIS_ADDRS": locks.addr,
		"SHOP_KEY_PREFIX": prefix, "SHOP_SQLITE_PATH": filepath.Join(t.TempDir(), "shop.db")})
	ctx := context.Background()

	mustPost(t, srv.URL+"/admin/v1/reset", testAdmin, `{"fixture":"default"}`)
	mustPost(t, srv.URL+"/api/v1/accounts/1/deposit", shoptestToken(t, 1), `{"amount_cents":100}`)
	counter := "{" + prefix + "lock:account:1}:fence"
	first := fenceOf(t, a, counter, locks.client)

	if keys := scanKeys(t, locks.client, "*"); len(keys) == 0 || !strings.Contains(strings.Join(keys, " "), "lock:account:1") {
		t.Errorf("lock Redis holds %q; want the account's lock keys", keys)
	}
	mainClient := redis.NewClient(&redis.Options{Addr: main})
	defer mainClient.Close()
	for _, k := range scanKeys(t, mainClient, prefix+"*") {
		if strings.Contains(k, "lock:") {
			t.Errorf("main Redis holds the lock key %q", k)
		}
	}
	if n, _ := mainClient.Exists(ctx, counter).Result(); n != 0 {
		t.Errorf("main Redis holds the fence counter %s", counter)
	}

	mustPost(t, srv.URL+"/admin/v1/reset", testAdmin, `{"fixture":"default"}`)
	if n, _ := locks.client.Exists(ctx, counter).Result(); n != 1 {
		t.Errorf("the reset removed the fence counter %s", counter)
	}
	mustPost(t, srv.URL+"/api/v1/accounts/1/deposit", shoptestToken(t, 1), `{"amount_cents":100}`)
	if second := fenceOf(t, a, counter, locks.client); second <= first {
		t.Errorf("fence after the reset %d, before %d; want it higher", second, first)
	}
}

// The lock Redis may be a Cluster, as the main one may: the lock keys and
// the fence counter share a hash slot.
func TestLockRedisMayBeACluster(t *testing.T) {
	addrs := testenv.Require(t, "SHOP_TEST_REDIS_CLUSTER_ADDRS")
	prefix := shoptest.Prefix("lockredis")
	srv, a := newTestServer(t, map[string]string{"SHOP_LOCK_REDIS_ADDRS": addrs, "SHOP_KEY_PREFIX": prefix})
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ",")})
	defer cluster.Close()
	mustPost(t, srv.URL+"/admin/v1/reset", testAdmin, `{"fixture":"default"}`)
	mustPost(t, srv.URL+"/api/v1/accounts/1/deposit", shoptestToken(t, 1), `{"amount_cents":100}`)
	counter := "{" + prefix + "lock:account:1}:fence"
	fenceOf(t, a, counter, cluster)
	cluster.Del(context.Background(), counter)
}

// fenceOf returns account 1's fence, after checking that it is the token
// the lock Redis's counter last gave.
func fenceOf(t *testing.T, a *app, counter string, locks redis.Cmdable) uint64 {
	t.Helper()
	acct, err := a.accounts.Get(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	last, err := locks.Get(context.Background(), counter).Uint64()
	if err != nil {
		t.Fatalf("fence counter %s on the lock Redis: %v", counter, err)
	}
	if acct.Fence != last {
		t.Errorf("account 1 was written with fence %d; the lock Redis's counter says %d", acct.Fence, last)
	}
	return acct.Fence
}

// The fences a kept database holds are forgotten at start only when the
// locks live on the embedded Redis: a lock Redis of its own outlives the
// process, its holders and its tokens with it.
func TestFencesKeptWhenTheLockRedisIsItsOwn(t *testing.T) {
	locks := startRedis(t)
	env := map[string]string{"SHOP_LOCK_REDIS_ADDRS": locks.addr, "SHOP_KEY_PREFIX": shoptest.Prefix("lockredis"),
		"SHOP_SQLITE_PATH": filepath.Join(t.TempDir(), "shop.db")}
	srv, a := newTestServer(t, env)
	mustPost(t, srv.URL+"/admin/v1/reset", testAdmin, `{"fixture":"default"}`)
	mustPost(t, srv.URL+"/api/v1/accounts/1/deposit", shoptestToken(t, 1), `{"amount_cents":100}`)
	before, err := a.accounts.Get(context.Background(), 1)
	if err != nil || before.Fence == 0 {
		t.Fatalf("account 1 after a deposit: fence %d, %v", before.Fence, err)
	}
	srv.Close()
	if err := a.close(); err != nil {
		t.Fatal(err)
	}

	_, again := newTestServer(t, env)
	after, err := again.accounts.Get(context.Background(), 1)
	if err != nil || after.Fence != before.Fence {
		t.Errorf("fence after a restart on the embedded main Redis: %d, %v; want %d kept", after.Fence, err, before.Fence)
	}
}

// The start-up check reads the lock server's eviction policy and
// persistence: a policy that can evict lock keys or fence counters, or no
// append-only file, is a warning; noeviction with AOF says nothing, and so
// does a server that refuses CONFIG.
func TestLockRedisSettingsWarnings(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		set  map[string]string
		want []string // substrings of the warnings, in order; none for no warning
	}{
		{name: "noeviction-aof", args: []string{"--appendonly", "yes"}},
		{name: "allkeys-lru", args: []string{"--appendonly", "yes"}, set: map[string]string{"maxmemory-policy": "allkeys-lru"},
			want: []string{"maxmemory_policy=allkeys-lru evicts=\"lock keys and fence counters\""}},
		{name: "volatile-ttl", args: []string{"--appendonly", "yes"}, set: map[string]string{"maxmemory-policy": "volatile-ttl"},
			want: []string{"maxmemory_policy=volatile-ttl evicts=\"lock keys\""}},
		{name: "no-aof", args: []string{"--appendonly", "no"}, want: []string{"appendonly=no"}},
		{name: "config-renamed", args: []string{"--appendonly", "no", "--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", ""}},
	} {
		t.Run(c.name, func(t *testing.T) {
			srv := startRedis(t, c.args...)
			for k, v := range c.set {
				if err := srv.client.ConfigSet(context.Background(), k, v).Err(); err != nil {
					t.Fatal(err)
				}
			}
			var logs logSink
			checkLockRedis(context.Background(), srv.client, srv.addr, slog.New(slog.NewTextHandler(&logs, nil)))
			warnings := logs.lines("level=WARN")
			if len(warnings) != len(c.want) {
				t.Fatalf("warnings:\n%s\nwant %d", strings.Join(warnings, "\n"), len(c.want))
			}
			for i, w := range c.want {
				if !strings.Contains(warnings[i], w) || !strings.Contains(warnings[i], srv.addr) {
					t.Errorf("warning %q; want it to name %s and %q", warnings[i], srv.addr, w)
				}
			}
		})
	}
}

// A lock Redis whose eviction policy can free held locks is named at
// start, and shop still starts; with CONFIG renamed away it starts without
// a word about it.
func TestStartWarnsOfAnEvictingLockRedis(t *testing.T) {
	for _, c := range []struct {
		name string
		args []string
		warn bool
	}{
		{"allkeys-lru", []string{"--appendonly", "yes", "--maxmemory-policy", "allkeys-lru"}, true},
		{"config-renamed", []string{"--appendonly", "yes", "--maxmemory-policy", "allkeys-lru", "--rename-command", "CONFIG", ""}, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			locks := startRedis(t, c.args...)
			cfg, err := config.Load(func(k string) string {
				return map[string]string{"SHOP_ENV": "dev", "SHOP_LOCK_REDIS_ADDRS": locks.addr,
					"SHOP_KEY_PREFIX": shoptest.Prefix("lockredis")}[k]
			})
			if err != nil {
				t.Fatal(err)
			}
			var logs logSink
			a, err := newApp(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(a.handler)
			defer func() { srv.Close(); _ = a.close() }()
			res, err := http.Get(srv.URL + "/readyz")
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusOK {
				t.Errorf("/readyz: %s", res.Status)
			}
			if got := len(logs.lines("maxmemory_policy=allkeys-lru")) > 0; got != c.warn {
				t.Errorf("warned of the eviction policy: %t, want %t; log:\n%s", got, c.warn, logs.String())
			}
		})
	}
}

// /readyz names the lock Redis when it stops answering, beside a main
// Redis that answers.
func TestReadyzChecksTheLockRedis(t *testing.T) {
	locks := startRedis(t)
	_, a := newTestServer(t, map[string]string{"SHOP_LOCK_REDIS_ADDRS": locks.addr})
	if down := a.readiness(context.Background()); len(down) != 0 {
		t.Fatalf("down = %v with both Redis up", down)
	}
	// Stopped, not killed: its sockets stay open, so the clients wait
	// rather than redial in the background past the test.
	if err := syscall.Kill(locks.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	down := a.readiness(context.Background())
	if err := syscall.Kill(locks.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if !errors.Is(down["lock redis"], errReadyTimeout) || len(down) != 1 {
		t.Errorf("down = %v; want only the lock redis, timed out", down)
	}
}

func mustPost(t *testing.T, url, token, body string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("POST %s: %d", url, res.StatusCode)
	}
}

func scanKeys(t *testing.T, c *redis.Client, match string) []string {
	t.Helper()
	keys, err := c.Keys(context.Background(), match).Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// privateRedis is a redis-server of one test's own on a loopback port.
type privateRedis struct {
	addr   string
	client *redis.Client
	cmd    *exec.Cmd
}

// startRedis starts a redis-server with args on a free loopback port and
// stops it when the test ends.
func startRedis(t *testing.T, args ...string) *privateRedis {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		testenv.Missing(t, "redis-server is not installed (scripts/testenv.sh up installs it)")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	r := &privateRedis{addr: fmt.Sprintf("127.0.0.1:%d", port)}
	r.cmd = exec.Command(bin, append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "",
		"--dir", t.TempDir()}, args...)...)
	r.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.stop)
	r.client = redis.NewClient(&redis.Options{Addr: r.addr})
	t.Cleanup(func() { r.client.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for r.client.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not answer within 10 s", r.addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return r
}

func (r *privateRedis) stop() {
	if r.cmd.Process == nil || r.cmd.ProcessState != nil {
		return
	}
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	_ = r.cmd.Wait()
}

// logSink collects log lines written from any goroutine.
type logSink struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// lines returns the lines that contain substr.
func (s *logSink) lines(substr string) []string {
	var out []string
	for _, l := range strings.Split(s.String(), "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return out
}

// On a Cluster every master is read, and each warning names its node:
// the test environment's cluster keeps no append-only file.
func TestLockRedisSettingsOfEveryClusterMaster(t *testing.T) {
	addrs := testenv.RequireList(t, "SHOP_TEST_REDIS_CLUSTER_ADDRS")
	cluster := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	defer cluster.Close()
	var mu sync.Mutex // ForEachMaster calls in parallel
	var masters []string
	err := cluster.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
		if v, err := node.ConfigGet(ctx, "appendonly").Result(); err != nil || v["appendonly"] != "no" {
			return fmt.Errorf("master %s: appendonly %v, %v; this test needs the test environment's cluster", node.Options().Addr, v, err)
		}
		mu.Lock()
		defer mu.Unlock()
		masters = append(masters, node.Options().Addr)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var logs logSink
	checkLockRedis(context.Background(), cluster, strings.Join(addrs, ","), slog.New(slog.NewTextHandler(&logs, nil)))
	warnings := logs.lines("appendonly=no")
	if len(warnings) != len(masters) {
		t.Fatalf("%d warnings for %d masters:\n%s", len(warnings), len(masters), logs.String())
	}
	for _, m := range masters {
		if len(logs.lines("node="+m)) != 1 {
			t.Errorf("master %s not named once:\n%s", m, logs.String())
		}
	}
}
