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
	for _, want := range []string{"\nshop_audit_ok 1\n", "\nshop_audit_drift{check=\"oversold_units\"} 0\n",
		"\nshop_audit_drift{check=\"balance_drift\"} 0\n", "\nshop_audit_checked_timestamp_seconds "} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics after an audit lacks %q", strings.TrimSpace(want))
		}
	}
}
