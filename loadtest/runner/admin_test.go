package main

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// adminServer answers every request with status and body, keeping the
// last request and its body.
func adminServer(t *testing.T, status int, body string) (admin, *http.Request, *string) {
	t.Helper()
	var got http.Request
	var gotBody string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = *r.Clone(context.Background())
		b, _ := io.ReadAll(r.Body)
		gotBody = string(b)
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return admin{url: srv.URL, token: "the-admin-token"}, &got, &gotBody
}

func TestAdminSendsJSONWithTheTokenAndDecodesTheAnswer(t *testing.T) {
	a, req, body := adminServer(t, http.StatusCreated, `{"sku":"lt-hot","stock":7}`)
	var out struct {
		Stock int `json:"stock"`
	}
	if err := a.do(context.Background(), http.MethodPost, "/admin/v1/products", map[string]int{"stock": 7}, &out); err != nil {
		t.Fatal(err)
	}
	if req.Header.Get("Authorization") != "Bearer the-admin-token" || req.Header.Get("Content-Type") != "application/json" {
		t.Errorf("headers %v", req.Header)
	}
	if req.Method != http.MethodPost || req.URL.Path != "/admin/v1/products" || *body != `{"stock":7}` {
		t.Errorf("sent %s %s %s", req.Method, req.URL.Path, *body)
	}
	if out.Stock != 7 {
		t.Errorf("decoded %+v", out)
	}
}

func TestAdminWithoutABodySendsNoContentType(t *testing.T) {
	a, req, _ := adminServer(t, http.StatusOK, `{}`)
	if err := a.do(context.Background(), http.MethodGet, "/admin/v1/audit", nil, nil); err != nil {
		t.Fatal(err)
	}
	if ct := req.Header.Get("Content-Type"); ct != "" {
		t.Errorf("Content-Type %q on a request without a body", ct)
	}
}

// A refused admin call says which call, the status, and what the
// service said about it.
func TestAdminErrorNamesTheCallTheStatusAndTheProblem(t *testing.T) {
	a, _, _ := adminServer(t, http.StatusForbidden, "  {\"title\":\"reset is not allowed\"}\n")
	err := a.do(context.Background(), http.MethodPost, "/admin/v1/reset", map[string]string{"fixture": "loadtest"}, nil)
	if err == nil || err.Error() != `POST /admin/v1/reset: 403 Forbidden: {"title":"reset is not allowed"}` {
		t.Errorf("error %v", err)
	}
}

func TestAddProductPostsTheAdminAPIsFields(t *testing.T) {
	a, req, body := adminServer(t, http.StatusCreated, `{}`)
	if err := a.addProduct(context.Background(), product{SKU: "lt-capacity", Name: "capacity", Stock: 100, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal([]byte(*body), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"sku": "lt-capacity", "name": "capacity", "stock": 100.0, "price_cents": 1.0}
	if req.URL.Path != "/admin/v1/products" || len(got) != len(want) {
		t.Fatalf("sent %s %v", req.URL.Path, got)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// The audit's totals are read by check name, whatever checks shop adds;
// the whole answer is kept beside the report.
func TestAuditReadsEveryChecksTotalAndKeepsTheAnswer(t *testing.T) {
	a, _, _ := adminServer(t, http.StatusOK,
		`{"ok":false,"oversold_units":{"total":3,"by_sku":{"lt-hot":3}},"balance_drift":{"total":0},"checked_at":"now"}`)
	raw := filepath.Join(t.TempDir(), "row.audit.json")
	ok, totals, err := a.audit(context.Background(), raw)
	if err != nil {
		t.Fatal(err)
	}
	if ok || len(totals) != 2 || totals["oversold_units"] != 3 || totals["balance_drift"] != 0 {
		t.Errorf("ok %v, totals %v", ok, totals)
	}
	b, err := os.ReadFile(raw)
	if err != nil || !strings.Contains(string(b), "\n  \"oversold_units\": {") {
		t.Errorf("kept answer %q (%v), want it indented", b, err)
	}
}

func TestAuditWithoutItsVerdictOrChecksIsAnError(t *testing.T) {
	for name, answer := range map[string]string{
		"no ok member": `{"oversold_units":{"total":0}}`,
		"no checks":    `{"ok":true}`,
	} {
		a, _, _ := adminServer(t, http.StatusOK, answer)
		if _, _, err := a.audit(context.Background(), filepath.Join(t.TempDir(), "audit.json")); err == nil {
			t.Errorf("%s: %s accepted", name, answer)
		}
	}
}
