package main

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/lockbench/shop/internal/config"
)

// TestAuditMetricsOnMetrics checks the wiring: the registry the auditor
// writes to is the one /metrics serves.
func TestAuditMetricsOnMetrics(t *testing.T) {
	srv, _ := newTestServer(t, nil)
	fetch := func(path, token string) string {
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
