package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
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
