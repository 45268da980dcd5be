package main

import (
	"context"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/shoptest"
)

// BenchmarkPurchaseCPU is the CPU the service spends on one purchase with
// the atomic-redis strategy, handler path included (routing, auth, body
// decoding, access log, metrics, the Lua take and the SQL transaction),
// against the real MariaDB and Redis. cpu-µs/op is the process's user +
// system CPU per purchase (getrusage), which the servers' own CPU is not
// part of; wall time per op depends on the servers and is not the point.
//
//	go test -run '^$' -bench PurchaseCPU -benchtime 3000x ./cmd/shop/
func BenchmarkPurchaseCPU(b *testing.B) {
	send, _ := benchApp(b, map[string]string{"SHOP_STOCK_STRATEGY": "atomic-redis"}, discard{})
	token := shoptest.Token(b, testSecret, 1)
	buy := func() {
		if code := send(context.Background(), purchasePath, token); code != http.StatusCreated {
			b.Fatalf("purchase: %d", code)
		}
	}
	for range 50 { // connections, scripts loaded
		buy()
	}
	measureCPU(b, buy)
}

// BenchmarkShedCPU is the CPU the service spends refusing one purchase
// at the concurrency limit, on the same path as BenchmarkPurchaseCPU: two
// purchases hold the route's limit of 2 (sleeping in their critical
// section) while the benchmark's are shed. A refusal must cost less than a
// sale, or a flood spends on refusals what it should spend on sales.
//
//	go test -run '^$' -bench 'PurchaseCPU|ShedCPU' -benchtime 3000x -benchmem ./cmd/shop/
func BenchmarkShedCPU(b *testing.B) {
	send, _ := atTheLimit(b, discard{})
	token := shoptest.Token(b, testSecret, 1)
	measureCPU(b, func() {
		if code := send(context.Background(), purchasePath, token); code != http.StatusServiceUnavailable {
			b.Fatalf("purchase past the limit: %d, want 503", code)
		}
	})
}

// atTheLimit runs the service with the purchase route's concurrency limit
// fixed at 2 and held by two purchases sleeping in their critical section
// until the test ends, and returns what sends a purchase, which is shed,
// and what reads /metrics.
func atTheLimit(tb testing.TB, logs io.Writer) (send func(ctx context.Context, path, token string) int, metrics func() string) {
	send, metrics = benchApp(tb, map[string]string{"SHOP_STOCK_STRATEGY": "atomic-sql", "SHOP_CRITICAL_SECTION_DELAY": "1h",
		"SHOP_ADMISSION_MIN_LIMIT": "2", "SHOP_ADMISSION_MAX_LIMIT": "2"}, logs)
	token := shoptest.Token(tb, testSecret, 1)
	ctx, cancel := context.WithCancel(context.Background())
	var holders sync.WaitGroup
	tb.Cleanup(holders.Wait)
	tb.Cleanup(cancel)
	for range 2 {
		holders.Go(func() { send(ctx, purchasePath, token) })
	}
	// Until both holders are admitted: a purchase sent before would be
	// admitted too, and sleep for the hour.
	for !strings.Contains(metrics(), `shop_admission_admitted_total{route="/api/v1/seckill/:sku/purchase"} 2`) {
		runtime.Gosched()
	}
	return send, metrics
}

const purchasePath = "/api/v1/seckill/cpu-hot/purchase"

// benchApp runs the service in process on the real MariaDB and Redis with
// env on top of the production settings, puts the product cpu-hot, and
// returns a function that sends it one purchase and one that reads /metrics.
func benchApp(b testing.TB, env map[string]string, logs io.Writer) (send func(ctx context.Context, path, token string) int, metrics func() string) {
	vars := map[string]string{
		"SHOP_ENV": "production", "SHOP_JWT_SECRET": testSecret, "SHOP_ADMIN_TOKEN": testAdmin,
		"SHOP_MYSQL_DSN":   shoptest.MySQL(b),
		"SHOP_REDIS_ADDRS": shoptest.Env(b, "SHOP_TEST_REDIS_ADDR"),
		"SHOP_KEY_PREFIX":  shoptest.Prefix("cpubench"),
		// /metrics on the handler under test.
		"SHOP_METRICS_ADDR": config.DefaultHTTPAddr,
	}
	maps.Copy(vars, env)
	cfg, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		b.Fatal(err)
	}
	// The production logger, writing JSON lines to a sink: its cost is
	// part of each request's.
	a, err := newApp(context.Background(), cfg, newLogger(cfg, logs))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.close() })
	do := func(ctx context.Context, method, path, token, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequestWithContext(ctx, method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		a.handler.ServeHTTP(rec, req)
		return rec
	}
	if code := do(context.Background(), http.MethodPost, "/admin/v1/products", testAdmin,
		`{"sku":"cpu-hot","name":"hot","stock":100000000,"price_cents":1}`).Code; code != http.StatusCreated && code != http.StatusOK {
		b.Fatalf("put product: %d", code)
	}
	send = func(ctx context.Context, path, token string) int {
		return do(ctx, http.MethodPost, path, token, `{"quantity":1}`).Code
	}
	metrics = func() string { return do(context.Background(), http.MethodGet, "/metrics", "", "").Body.String() }
	return send, metrics
}

// measureCPU times op b.N times and reports the process's CPU per op.
func measureCPU(b *testing.B, op func()) {
	cpu0 := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		op()
	}
	b.StopTimer()
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "cpu-µs/op")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
