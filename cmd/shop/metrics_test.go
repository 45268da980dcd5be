package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/problem"
)

// TestMetricsAreNotOnTheAPIPortByDefault: without SHOP_METRICS_ADDR the
// API handler answers /metrics with 404 and the metrics handler, which
// serve puts on a listener of its own, serves them.
func TestMetricsAreNotOnTheAPIPortByDefault(t *testing.T) {
	vars := map[string]string{"SHOP_ENV": "production", "SHOP_JWT_SECRET": testSecret, "SHOP_ADMIN_TOKEN": testAdmin}
	cfg, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	a, err := newApp(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.close() })
	for _, tc := range []struct {
		name    string
		handler http.Handler
		want    int
	}{{"api", a.handler, http.StatusNotFound}, {"metrics", a.metrics, http.StatusOK}} {
		rec := httptest.NewRecorder()
		tc.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
		if rec.Code != tc.want {
			t.Errorf("GET /metrics on the %s handler: %d, want %d", tc.name, rec.Code, tc.want)
		}
	}
}

// TestAuditMetricsOnMetrics checks the wiring: the registry the auditor
// writes to is the one /metrics serves.
func TestAuditMetricsOnMetrics(t *testing.T) {
	srv, _ := newTestServer(t, nil)
	fetch := func(path, token string) string { t.Helper(); return getOK(t, srv, path, token) }
	if m := fetch("/metrics", ""); strings.Contains(m, "shop_audit_ok") {
		t.Error("shop_audit_ok exported before any audit")
	}
	fetch("/admin/v1/audit", testAdmin)
	m := fetch("/metrics", "")
	for _, want := range []string{"\nshop_audit_ok 1\n", "\nshop_audit_drift{check=\"oversold_units\",unit=\"units\"} 0\n",
		"\nshop_audit_drift{check=\"balance_drift\",unit=\"cents\"} 0\n", "\nshop_audit_checked_timestamp_seconds "} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics after an audit lacks %q", strings.TrimSpace(want))
		}
	}
}

// TestAuditDriftUnitsFollowTheCheck: a drift in cents is labelled cents
// and one in units units, so that no dashboard or alert adds money to a
// count; the checks named neither are counts of rows or likes.
func TestAuditDriftUnitsFollowTheCheck(t *testing.T) {
	srv, _ := newTestServer(t, nil)
	getOK(t, srv, "/admin/v1/audit", testAdmin)
	series := regexp.MustCompile(`shop_audit_drift\{check="([a-z_]+)",unit="([a-z]+)"\}`).FindAllStringSubmatch(getOK(t, srv, "/metrics", ""), -1)
	if len(series) == 0 {
		t.Fatal("no shop_audit_drift series after an audit")
	}
	want := map[string]string{"like_drift": "likes"}
	for _, m := range series {
		check, unit := m[1], m[2]
		w, ok := want[check]
		switch {
		case ok:
		case strings.HasSuffix(check, "_cents"), check == "balance_drift":
			w = "cents"
		case strings.HasSuffix(check, "_units"), check == "stock_drift":
			w = "units"
		default:
			w = "count"
		}
		if unit != w {
			t.Errorf("shop_audit_drift{check=%q} has unit=%q, want %q", check, unit, w)
		}
	}
}

// getOK is the body of GET path, which must answer 200.
func getOK(t *testing.T, srv *httptest.Server, path, token string) string {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s %v", path, res.StatusCode, body, err)
	}
	return string(body)
}

// TestHTTPMetricsClampMethods: a method no route knows must not mint a
// series of its own (CVE-2022-21698, fixed in promhttp the same way), and
// the build is exported as shop_build_info.
func TestHTTPMetricsClampMethods(t *testing.T) {
	srv, _ := newTestServer(t, nil)
	for _, m := range []string{"AAA1", "BBB2", "get"} {
		req, err := http.NewRequest(m, srv.URL+"/healthz", nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	res, err := srv.Client().Get(srv.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	m := string(b)
	for _, bad := range []string{`method="AAA1"`, `method="BBB2"`, `method="get"`} {
		if strings.Contains(m, bad) {
			t.Errorf("/metrics has a series for %s", bad)
		}
	}
	if !strings.Contains(m, `shop_http_requests_total{code="405",method="OTHER",route="unmatched"} 3`) {
		t.Errorf("the unknown methods are not counted as OTHER:\n%s", grep(m, "shop_http_requests_total"))
	}
	if !strings.Contains(m, "\nshop_build_info{goversion=\"go") {
		t.Errorf("no shop_build_info:\n%s", grep(m, "build_info"))
	}
}

func grep(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestEveryLogLineOfARequestHasItsRequestID: with Redis down, GET /readyz
// logs "not ready", "request failed" and "request"; each must carry the
// request's id, so that one grep finds all a request did.
func TestEveryLogLineOfARequestHasItsRequestID(t *testing.T) {
	vars := map[string]string{
		"SHOP_ENV": "production", "SHOP_JWT_SECRET": testSecret, "SHOP_ADMIN_TOKEN": testAdmin,
		"SHOP_LOG_FORMAT": "json", "SHOP_REDIS_ADDRS": "127.0.0.1:1", "SHOP_STOCK_STRATEGY": "atomic-sql",
	}
	cfg, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	log := newLogger(cfg, logs)
	defer slog.SetDefault(slog.Default())
	slog.SetDefault(log)
	a, err := newApp(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	srv := httptest.NewServer(a.handler)
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/readyz", nil)
	req.Header.Set("X-Request-Id", "trace-me-42")
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	var lines int
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct {
			Msg       string `json:"msg"`
			RequestID string `json:"request_id"`
		}
		if json.Unmarshal([]byte(line), &rec) != nil || !slices.Contains([]string{"not ready", "request failed", "request"}, rec.Msg) {
			continue
		}
		lines++
		if rec.RequestID != "trace-me-42" {
			t.Errorf("a line of the request has request_id %q: %s", rec.RequestID, line)
		}
		if strings.Count(line, `"request_id"`) > 1 {
			t.Errorf("request_id twice: %s", line)
		}
	}
	if lines < 3 {
		t.Errorf("%d lines of the request, want not ready, request failed and request:\n%s", lines, logs)
	}
}

// TestShedRequestsCountedApart: a 503 lock-busy (load shed on a hot key:
// nothing changed, retry invited) is counted in shop_http_shed_total as
// well as in the requests, so that an alert on errors can leave it out;
// a 503 outcome-unknown (a change may have landed) is an error, not
// shedding.
func TestShedRequestsCountedApart(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newHTTPMetrics(reg)
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(m.observe, problem.Errors(problems()))
	r.GET("/busy", problem.Handle(func(*gin.Context) error { return lockkit.ErrNotAcquired }))
	r.GET("/unknown", problem.Handle(func(*gin.Context) error { return mysql.ErrInvalidConn }))
	for _, path := range []string{"/busy", "/busy", "/unknown"} {
		w := httptest.NewRecorder()
		r.ServeHTTP(w, httptest.NewRequest(http.MethodGet, path, nil))
		if w.Code != http.StatusServiceUnavailable {
			t.Fatalf("GET %s: %d, want 503", path, w.Code)
		}
	}
	if got := testutil.ToFloat64(m.shed.WithLabelValues("/busy", "GET", "lock-busy")); got != 2 {
		t.Errorf("shed lock-busy on /busy = %v, want 2", got)
	}
	if n := testutil.CollectAndCount(m.shed); n != 1 {
		t.Errorf("shop_http_shed_total has %d series, want only lock-busy's: outcome-unknown is an error", n)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("/unknown", "GET", "503")); got != 1 {
		t.Errorf("requests 503 on /unknown = %v, want 1", got)
	}
}

// TestLockMetricsLabelEachKeyByItsClass: every acquisition the service
// makes is counted under its key's class, a flow over keys of two classes
// (placing an order locks the stock and the account, paying it the order
// and the account) under each key's own, the leader leases of the order
// closer and the idempotency pruner under "other", and the event relay's
// under its own (dashboards and alerts select on these values).
func TestLockMetricsLabelEachKeyByItsClass(t *testing.T) {
	srv, _ := newTestServer(t, nil)
	c := newContract(t, srv.URL)
	u7 := shoptestToken(t, 7)
	for _, tc := range []apiCase{
		{name: "product", method: "POST", path: "/admin/v1/products", token: testAdmin, status: 201,
			body: `{"sku":"class-1","name":"Class item","stock":5,"price_cents":100}`},
		{name: "account", method: "POST", path: "/admin/v1/accounts", token: testAdmin, body: `{"id":7,"balance_cents":1000}`, status: 201},
		{name: "entity", method: "POST", path: "/admin/v1/entities", token: testAdmin, body: `{"type":"post","id":"class-7","owner_id":2}`, status: 201},
		{name: "like", method: "PUT", path: "/api/v1/likes/post/class-7", token: u7, status: 200},
	} {
		c.run(t, srv, tc)
	}
	var idemToken struct{ Token string }
	_ = json.Unmarshal(c.run(t, srv, apiCase{method: "POST", path: "/api/v1/idempotency-tokens", token: u7, status: 201}), &idemToken)
	var placed struct{ ID int64 }
	_ = json.Unmarshal(c.run(t, srv, apiCase{method: "POST", path: "/api/v1/orders", token: u7, body: `{"sku":"class-1","quantity":1}`,
		header: map[string]string{"Idempotency-Key": idemToken.Token}, status: 201}), &placed)
	c.run(t, srv, apiCase{method: "POST", path: fmt.Sprintf("/api/v1/orders/%d/pay", placed.ID), token: u7, status: 200})

	waits := func() map[string]string {
		counts := map[string]string{}
		re := regexp.MustCompile(`(?m)^shop_lock_wait_seconds_count\{backend="redis",class="([a-z-]+)"\} (\d+)$`)
		for _, m := range re.FindAllStringSubmatch(getOK(t, srv, "/metrics", ""), -1) {
			counts[m[1]] = m[2]
		}
		return counts
	}
	// The closer and the pruner take their leader leases in the
	// background, once each in the test's time (their next rounds are
	// 30 s and more away).
	for deadline := time.Now().Add(30 * time.Second); waits()["other"] != "2" && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	want := map[string]string{"stock": "1", "order": "1", "account": "2", "like": "1", "other": "2"}
	got := waits()
	// The event relay tries its lease every interval, under its own class.
	if got["event-relay"] == "" {
		t.Errorf("no acquisition of class event-relay: %v", got)
	}
	delete(got, "event-relay")
	if !maps.Equal(got, want) {
		t.Errorf("acquisitions by class %v, want %v", got, want)
	}
}
