package main

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockbench/shop/loadtest/runner/report"
)

// The limit flow's counters reach the row's result, and a crossed
// limit_over_limit threshold is listed with the others.
func TestSummaryCarriesTheUnitsSoldPastTheLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "row.k6.json")
	summary := `{"metrics": {
		"limit_sold": {"values": {"count": 43}},
		"limit_over_limit": {"values": {"count": 3}, "thresholds": {"count==0": {"ok": false}}}
	}}`
	if err := os.WriteFile(path, []byte(summary), 0o600); err != nil {
		t.Fatal(err)
	}
	var r report.Result
	if err := readSummary(path, &r); err != nil {
		t.Fatal(err)
	}
	if r.LimitSold != 43 || r.OverLimit != 3 {
		t.Errorf("limit sold %d, over the limit %d; want 43 and 3", r.LimitSold, r.OverLimit)
	}
	if len(r.Crossed) != 1 || r.Crossed[0] != "limit_over_limit count==0" {
		t.Errorf("crossed %q", r.Crossed)
	}
}

func TestSummaryGivesLatenciesTheSaleRateAndSortedThresholds(t *testing.T) {
	path := filepath.Join(t.TempDir(), "row.k6.json")
	summary := `{"metrics": {
		"seckill_sold": {"values": {"count": 300}},
		"seckill_sold_at": {"values": {"max": 6000}},
		"seckill_sold_latency": {"values": {"p(50)": 12.5, "p(95)": 30, "p(99)": 41.5, "max": 90, "count": 300}},
		"orders_duplicate_seen": {"values": {"count": 1}, "thresholds": {"count==0": {"ok": false}}},
		"http_req_failed": {"values": {"rate": 0.25}, "thresholds": {"rate<0.5": {"ok": true}}},
		"balance_latency": {"values": {"p(99)": 8}, "thresholds": {"p(99)<5": {"ok": false}}}
	}}`
	if err := os.WriteFile(path, []byte(summary), 0o600); err != nil {
		t.Fatal(err)
	}
	r := report.Result{Crossed: []string{"from an earlier read"}}
	if err := readSummary(path, &r); err != nil {
		t.Fatal(err)
	}
	if r.Sold != 300 || r.OrdersPerSec != 50 { // 300 sold by the last sale at 6 s
		t.Errorf("sold %d at %.1f/s, want 300 at 50/s", r.Sold, r.OrdersPerSec)
	}
	if want := (report.Latency{P50: 12.5, P95: 30, P99: 41.5, Max: 90, N: 300}); r.SoldLatency != want {
		t.Errorf("sold latency %+v, want %+v", r.SoldLatency, want)
	}
	if r.FailedRate != 0.25 || r.DupsSeen != 1 {
		t.Errorf("failed rate %g, duplicates seen %d", r.FailedRate, r.DupsSeen)
	}
	if want := []string{"balance_latency p(99)<5", "orders_duplicate_seen count==0"}; !slices.Equal(r.Crossed, want) {
		t.Errorf("crossed %q, want %q", r.Crossed, want)
	}
}

func TestSummaryThatIsMissingOrUnreadableIsAnError(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.json")
	if err := os.WriteFile(bad, []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{filepath.Join(dir, "missing.json"), bad} {
		if err := readSummary(path, &report.Result{}); err == nil {
			t.Errorf("%s read without an error", path)
		}
	}
}

// k6 gets the row's settings and never one of the runner's own SHOP_* or
// K6_* variables, which would change what the script does.
func TestK6EnvIsTheRowsSettingsAlone(t *testing.T) {
	t.Setenv("SHOP_RATE", "9999")
	t.Setenv("K6_OUT", "cloud")
	r := quietRunner("redis").newRow(rowSpec("redis", 3, allFlows))
	r.o.Rate, r.o.Stock, r.o.MaxVUs, r.o.Users = 70, 200, 400, 500
	r.urls, r.tokens = []string{"http://127.0.0.1:1", "http://127.0.0.1:2"}, "tokens.json"
	env := envMap(t, r.k6Env("row.k6.json", 15))
	if _, ok := env["K6_OUT"]; ok {
		t.Error("the runner's K6_OUT reached k6")
	}
	want := map[string]string{
		"SHOP_URLS": "http://127.0.0.1:1,http://127.0.0.1:2", "SHOP_RATE": "70", "SHOP_STOCK": "200", "SHOP_DURATION": "15",
		"SHOP_FLOWS": "seckill,balance,likes,orders,limit", "SHOP_BUYERS": "500", "SHOP_MAX_VUS": "400",
		"SHOP_SKU": hotSKU, "SHOP_ORDER_SKU": orderSKU, "SHOP_LIMITED_SKU": limitedSKU, "K6_NO_USAGE_REPORT": "true",
	}
	for k, v := range want {
		if env[k] != v {
			t.Errorf("%s=%q, want %q", k, env[k], v)
		}
	}
	for _, k := range []string{"SHOP_TOKENS", "SHOP_SUMMARY"} {
		if !filepath.IsAbs(env[k]) {
			t.Errorf("%s=%q: k6 runs the script from elsewhere, the path must be absolute", k, env[k])
		}
	}
}

// k6 exits 99 when a threshold is crossed, which the unsafe rows do on
// purpose: that is a result. Any other failure is an error of the run.
func TestRunK6TellsCrossedThresholdsFromFailures(t *testing.T) {
	rn := testRunner(t)
	t.Setenv("RUNNER_FAKE", "k6")
	rn.o.script, rn.o.Duration, rn.o.Stock = "shop.js", 2*time.Second, 42
	for _, c := range []struct {
		exit    string
		want    int
		wantErr bool
	}{{"0", 0, false}, {"99", 99, false}, {"107", 107, true}} {
		t.Setenv("RUNNER_FAKE_EXIT", c.exit)
		r := rn.newRow(rowSpec("none", 3, allFlows))
		summary := filepath.Join(rn.o.out, "none.k6.json")
		code, err := r.runK6(context.Background(), summary)
		if code != c.want || (err != nil) != c.wantErr {
			t.Errorf("k6 exiting %s: %d, %v", c.exit, code, err)
		}
		if c.wantErr && (err == nil || !strings.Contains(err.Error(), r.logPath("k6"))) {
			t.Errorf("error %v does not name k6's log", err)
		}
		// The fake sold the stock it was given, by the end of the phase.
		var res report.Result
		if err := readSummary(summary, &res); err != nil || res.Sold != 42 || res.LastSaleMs != 2000 {
			t.Errorf("summary: sold %d, last sale %.0f ms (%v)", res.Sold, res.LastSaleMs, err)
		}
	}
	if log := logOf(t, filepath.Join(rn.o.out, "logs", "none-k6.log")); !strings.Contains(log, "k6 args: run --quiet --no-color shop.js") {
		t.Errorf("k6 log %q", log)
	}
}
