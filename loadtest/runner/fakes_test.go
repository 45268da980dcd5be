package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// The tests start real processes: this test binary again, told by
// RUNNER_FAKE which program to be. Only its env var reaches the children
// the runner starts (it strips SHOP_* and K6_ from its own), so a test
// steers a fake with RUNNER_FAKE_* variables.
func TestMain(m *testing.M) {
	if role := os.Getenv("RUNNER_FAKE"); role != "" {
		os.Exit(fake(role))
	}
	os.Exit(m.Run())
}

func fake(role string) int {
	switch role {
	case "shop":
		return fakeShop(os.Args[1])
	case "k6":
		return fakeK6()
	case "ceiling":
		return fakeCeiling()
	case "refuser":
		return fakeRefuser()
	case "parent":
		return fakeParent()
	case "exit":
		return 0
	}
	fmt.Fprintf(os.Stderr, "no fake %q\n", role)
	return 2
}

// fakeShop is `shop migrate|serve|consume`: migrate prints and exits;
// serve answers /readyz (503 for the first RUNNER_FAKE_NOT_READY probes,
// for ever if -1) and the admin calls of a row's set-up, with the row's
// admin token, and logs what it is asked; SIGTERM ends it, unless
// RUNNER_FAKE_TERM=ignore. RUNNER_FAKE_SERVE=exit makes it exit at start.
func fakeShop(command string) int {
	switch {
	case command == "migrate" && os.Getenv("RUNNER_FAKE_MIGRATE") == "fail":
		fmt.Println("migrate: unknown database")
		return 1
	case command == "migrate":
		fmt.Println("migrated", os.Getenv("SHOP_MYSQL_DSN"))
		return 0
	case command != "serve" && command != "consume":
		return 2
	case os.Getenv("RUNNER_FAKE_SERVE") == "exit":
		fmt.Println("cannot start")
		return 3
	}
	term := make(chan os.Signal, 1)
	signal.Notify(term, syscall.SIGTERM)
	l, err := net.Listen("tcp", os.Getenv("SHOP_HTTP_ADDR"))
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println(command, "listening as", os.Getpid())
	go func() { _ = http.Serve(l, fakeShopAPI()) }()
	for range term {
		if os.Getenv("RUNNER_FAKE_TERM") == "ignore" {
			fmt.Println("SIGTERM ignored")
			continue
		}
		fmt.Println("drained after SIGTERM")
		return 0
	}
	return 0
}

func fakeShopAPI() http.Handler {
	notReady, _ := strconv.Atoi(os.Getenv("RUNNER_FAKE_NOT_READY"))
	var probes atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if n := probes.Add(1); notReady < 0 || n <= int64(notReady) {
			fmt.Println("readyz 503")
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		fmt.Println("readyz 200")
	})
	admin := func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer "+os.Getenv("SHOP_ADMIN_TOKEN") {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Println(r.URL.Path, string(b))
		w.WriteHeader(http.StatusCreated)
	}
	mux.HandleFunc("POST /admin/v1/reset", admin)
	mux.HandleFunc("POST /admin/v1/products", admin)
	return mux
}

// fakeK6 is `k6 run`: it writes a summary from the environment the
// runner gave it (sold = SHOP_STOCK, the last sale at SHOP_DURATION) and
// exits RUNNER_FAKE_EXIT.
func fakeK6() int {
	stock, _ := strconv.Atoi(os.Getenv("SHOP_STOCK"))
	secs, _ := strconv.Atoi(os.Getenv("SHOP_DURATION"))
	summary := map[string]any{"metrics": map[string]any{
		"seckill_sold":    map[string]any{"values": map[string]float64{"count": float64(stock)}},
		"seckill_sold_at": map[string]any{"values": map[string]float64{"max": float64(secs * 1000)}},
	}}
	b, _ := json.Marshal(summary)
	if err := os.WriteFile(os.Getenv("SHOP_SUMMARY"), b, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintln(os.Stderr, "k6 args:", strings.Join(os.Args[1:], " "))
	code, _ := strconv.Atoi(os.Getenv("RUNNER_FAKE_EXIT"))
	return code
}

// fakeCeiling prints a line of progress, then the ceiling as JSON, its
// window naming the key prefix and the arguments it was given.
func fakeCeiling() int {
	if os.Getenv("RUNNER_FAKE_EXIT") == "1" {
		fmt.Fprintln(os.Stderr, "ceiling: cannot reach the database")
		return 1
	}
	fmt.Println("timing 300 purchases")
	window := os.Getenv("SHOP_KEY_PREFIX") + " " + strings.Join(os.Args[1:], " ")
	b, _ := json.Marshal(map[string]any{"window": window, "serialized_us_median": 1250.0, "ceiling_per_sec": 800.0})
	fmt.Println(string(b))
	return 0
}

// fakeRefuser is the bare 503 server: it prints its address, then turns
// every request away, or answers RUNNER_FAKE_STATUS. RUNNER_FAKE_SERVE=exit
// makes it exit before it prints anything.
func fakeRefuser() int {
	if os.Getenv("RUNNER_FAKE_SERVE") == "exit" {
		return 1
	}
	status := http.StatusServiceUnavailable
	if s, err := strconv.Atoi(os.Getenv("RUNNER_FAKE_STATUS")); err == nil {
		status = s
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 1
	}
	fmt.Println("http://" + l.Addr().String())
	_ = http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
	return 0
}

// fakeParent is a runner: it starts a fake shop as the runner starts its
// instances, waits until it is ready, prints its pid and waits to be
// killed.
func fakeParent() int {
	port, err := freePort()
	if err != nil {
		return 1
	}
	env := append(os.Environ(), "RUNNER_FAKE=shop", "SHOP_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(port))
	p := program{argv: []string{os.Args[0], "serve"}, env: env, logPath: os.Getenv("RUNNER_FAKE_CHILD_LOG")}
	in, err := p.startInstance(port, os.O_TRUNC)
	if err == nil {
		err = in.waitReady(context.Background(), time.Minute)
	}
	if err != nil {
		fmt.Println(err)
		return 1
	}
	fmt.Println(in.pid())
	select {}
}

// fakeShopProgram is a fake `shop serve` on a free port, logging to a
// file of the test's, with extra RUNNER_FAKE_* settings.
func fakeShopProgram(t *testing.T, settings ...string) (program, int) {
	t.Helper()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	env := append(os.Environ(), "RUNNER_FAKE=shop", "SHOP_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(port))
	logPath := filepath.Join(t.TempDir(), "shop.log")
	return program{argv: []string{os.Args[0], "serve"}, env: append(env, settings...), logPath: logPath}, port
}

// startFake starts p, fails the test if it cannot, and kills it at the
// end of the test if the test left it running.
func startFake(t *testing.T, p program, port int) *instance {
	t.Helper()
	in, err := p.startInstance(port, os.O_TRUNC)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.kill)
	return in
}

// logOf is what the process wrote to its log so far.
func logOf(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
