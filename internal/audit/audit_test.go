package audit

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// drifts is a check whose result the test sets: the metrics are pure logic
// over the checks' answers, which the domains' own tests run on real stores.
type drifts struct {
	by  map[string]int64
	err error
}

func (d *drifts) run(context.Context) (map[string]int64, error) { return d.by, d.err }

func get(t *testing.T, h http.Handler, path string) *httptest.ResponseRecorder {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec
}

func TestAuditSetsGauges(t *testing.T) {
	stock := &drifts{by: map[string]int64{"sku-1": 3, "sku-2": 0}}
	balance := &drifts{by: map[string]int64{"1": -40, "2": 15}}
	a := New([]Check{
		{Name: "oversold_units", By: "by_sku", Unit: "units", Run: stock.run},
		{Name: "balance_drift", By: "by_account", Unit: "cents", Run: balance.run},
		{Name: "unitless_drift", By: "by_key", Run: (&drifts{}).run},
	}, nil)
	reg := prometheus.NewPedanticRegistry()
	a.RegisterMetrics(reg)
	gin.SetMode(gin.TestMode)
	r := gin.New()
	a.Register(r.Group("/admin/v1"))

	// Nothing before the first audit: 0 would read as "drifted".
	if n, err := testutil.GatherAndCount(reg); err != nil || n != 0 {
		t.Fatalf("before any audit: %d series, %v; want none", n, err)
	}

	if rec := get(t, r, "/admin/v1/audit"); rec.Code != http.StatusOK {
		t.Fatalf("audit: %d %s", rec.Code, rec.Body)
	}
	want := `
# HELP shop_audit_drift Total drift each audit check found in the last audit (0: the invariant holds), in the check's unit.
# TYPE shop_audit_drift gauge
shop_audit_drift{check="balance_drift",unit="cents"} 55
shop_audit_drift{check="oversold_units",unit="units"} 3
shop_audit_drift{check="unitless_drift",unit="count"} 0
# HELP shop_audit_ok 1 if the last audit found no drift at all, 0 if any check drifted.
# TYPE shop_audit_ok gauge
shop_audit_ok 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "shop_audit_drift", "shop_audit_ok"); err != nil {
		t.Error(err)
	}
	first := testutil.ToFloat64(a.metrics.checkedAt)
	if first == 0 {
		t.Error("shop_audit_checked_timestamp_seconds not set")
	}

	// A reset and a clean run: every gauge follows the newest audit.
	stock.by, balance.by = nil, map[string]int64{"1": 0}
	get(t, r, "/admin/v1/audit")
	if got := testutil.ToFloat64(a.metrics.ok); got != 1 {
		t.Errorf("clean audit: shop_audit_ok %v, want 1", got)
	}
	for check, unit := range map[string]string{"oversold_units": "units", "balance_drift": "cents"} {
		if got := testutil.ToFloat64(a.metrics.drift.WithLabelValues(check, unit)); got != 0 {
			t.Errorf("clean audit: shop_audit_drift{check=%q} %v, want 0", check, got)
		}
	}
	clean := testutil.ToFloat64(a.metrics.checkedAt)
	if clean < first {
		t.Errorf("timestamp went back: %v after %v", clean, first)
	}

	// A failed audit knows nothing new: the gauges keep the last result
	// and the timestamp its age.
	stock.err = errors.New("database down")
	if rec := get(t, r, "/admin/v1/audit"); rec.Code == http.StatusOK {
		t.Fatalf("failed audit answered 200: %s", rec.Body)
	}
	if ok, at := testutil.ToFloat64(a.metrics.ok), testutil.ToFloat64(a.metrics.checkedAt); ok != 1 || at != clean {
		t.Errorf("after a failed audit: ok %v at %v, want 1 at %v", ok, at, clean)
	}
}

func TestAuditWithoutMetrics(t *testing.T) {
	a := New([]Check{{Name: "like_drift", By: "by_owner", Run: (&drifts{}).run}}, nil)
	r, err := a.Audit(context.Background())
	if err != nil || !r.OK {
		t.Errorf("audit: %+v, %v", r, err)
	}
}

type fixtureRecorder struct{ got []string }

func (f *fixtureRecorder) Reset(_ context.Context, fixture string) error {
	f.got = append(f.got, fixture)
	return nil
}

// TestResetWithAnEmptyBodyIsTheDefaultFixture: an empty body resets to the
// default fixture however it is framed: none, Content-Length: 0, or
// chunked with no chunk (no Content-Length at all, as curl -T /dev/null or
// a streaming client sends it).
func TestResetWithAnEmptyBodyIsTheDefaultFixture(t *testing.T) {
	f := &fixtureRecorder{}
	a := New(nil, []Resetter{f})
	gin.SetMode(gin.TestMode)
	r := gin.New()
	a.Register(r.Group("/admin/v1"))
	for _, tc := range []struct {
		name   string
		body   string
		length int64
		json   bool
		want   string
	}{
		{"no-body", "", 0, false, Fixtures[0]},
		{"chunked-empty", "", -1, false, Fixtures[0]},
		{"chunked-empty-json", "", -1, true, Fixtures[0]},
		{"chunked-fixture", `{"fixture":"` + Fixtures[len(Fixtures)-1] + `"}`, -1, true, Fixtures[len(Fixtures)-1]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodPost, "/admin/v1/reset", strings.NewReader(tc.body))
			req.ContentLength = tc.length
			if tc.json {
				req.Header.Set("Content-Type", "application/json")
			}
			rec := httptest.NewRecorder()
			r.ServeHTTP(rec, req)
			if rec.Code != http.StatusOK || len(f.got) == 0 || f.got[len(f.got)-1] != tc.want {
				t.Errorf("status %d %s, reset to %v; want 200 and %s", rec.Code, rec.Body, f.got, tc.want)
			}
		})
	}
}
