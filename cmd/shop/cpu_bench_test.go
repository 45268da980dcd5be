package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
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
	vars := map[string]string{
		"SHOP_ENV": "production", "SHOP_JWT_SECRET": testSecret, "SHOP_ADMIN_TOKEN": testAdmin,
		"SHOP_STOCK_STRATEGY": "atomic-redis",
		"SHOP_MYSQL_DSN":      shoptest.MySQL(b),
		"SHOP_REDIS_ADDRS":    shoptest.Env(b, "SHOP_TEST_REDIS_ADDR"),
		"SHOP_KEY_PREFIX":     shoptest.Prefix("cpubench"),
	}
	cfg, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		b.Fatal(err)
	}
	// The production logger, writing JSON lines to a sink: its cost is
	// part of each request's.
	a, err := newApp(context.Background(), cfg, newLogger(cfg, discard{}))
	if err != nil {
		b.Fatal(err)
	}
	defer a.close()
	send := func(method, path, token, body string) int {
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		a.handler.ServeHTTP(rec, req)
		return rec.Code
	}
	if code := send(http.MethodPost, "/admin/v1/products", testAdmin,
		`{"sku":"cpu-hot","name":"hot","stock":100000000,"price_cents":1}`); code != http.StatusCreated && code != http.StatusOK {
		b.Fatalf("put product: %d", code)
	}
	token := shoptest.Token(b, testSecret, 1)
	buy := func() {
		if code := send(http.MethodPost, "/api/v1/seckill/cpu-hot/purchase", token, `{"quantity":1}`); code != http.StatusCreated {
			b.Fatalf("purchase: %d", code)
		}
	}
	for range 50 { // connections, scripts loaded
		buy()
	}
	cpu0 := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		buy()
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
