package main

import (
	"os"
	"path/filepath"
	"testing"

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
