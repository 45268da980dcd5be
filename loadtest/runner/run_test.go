package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lockbench/shop/loadtest/runner/report"
)

// zeroAudit is an audit that found nothing.
func zeroAudit() map[string]int64 {
	return map[string]int64{report.CheckOversold: 0, report.CheckBalance: 0, report.CheckLikes: 0, report.CheckDuplicates: 0}
}

// measured is what a row that ran k6 and read its audit brings back: the
// stock sold out, the audit clean, unless change says otherwise.
func measured(change func(*report.Result)) func(report.Row) report.Result {
	return func(s report.Row) report.Result {
		res := report.Result{Spec: s, Stock: 100, Sold: 100, AuditOK: true, Audit: zeroAudit()}
		if change != nil {
			change(&res)
		}
		return res
	}
}

var (
	oversold = measured(func(r *report.Result) { r.AuditOK, r.Audit[report.CheckOversold] = false, 4 })
	clean    = measured(nil)
)

// quietRunner is a runner of rows whose log goes nowhere.
func quietRunner(rows ...string) runner {
	var o options
	o.Rows, o.Instances, o.Flows = rows, 3, allFlows
	return runner{o: o, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
}

// fakeRows runs each row as results says: a result, or an error when the
// row has none.
func fakeRows(results map[string]func(report.Row) report.Result) func(context.Context, report.Row) (report.Result, error) {
	return func(_ context.Context, s report.Row) (report.Result, error) {
		if f, ok := results[s.Name]; ok {
			return f(s), nil
		}
		return report.Result{Spec: s, Sold: 99}, errors.New("server down")
	}
}

// What makes the run fail: a row that contradicts its promise, whichever
// way. A lock row must show no damage and sell out, an unsafe row must
// show the damage it allows, and a row that did not run fails as well.
func TestTheRunFailsOnEveryRowThatContradictsItsPromise(t *testing.T) {
	cases := []struct {
		name    string
		results map[string]func(report.Row) report.Result
		fails   []string // rows named under FAIL
	}{
		{"a lock clean, none damaged: pass", map[string]func(report.Row) report.Result{"redis": clean, "none": oversold}, nil},
		{"a lock with damage", map[string]func(report.Row) report.Result{"redis": oversold, "none": oversold}, []string{"redis (BROKEN): audit oversold_units = 4"}},
		{"none without damage proves nothing", map[string]func(report.Row) report.Result{"redis": clean, "none": clean}, []string{"none (INCONCLUSIVE)"}},
		{"a lock that starved the sale", map[string]func(report.Row) report.Result{
			"redis": measured(func(r *report.Result) { r.Sold = 1 }), "none": oversold}, []string{"redis (BROKEN): sold 1 of 100 units"}},
		{"a lock whose holders overlapped, caught by the fence", map[string]func(report.Row) report.Result{
			"redis": measured(func(r *report.Result) { r.Fenced = 2 }), "none": oversold}, []string{"redis (BROKEN): 2 writes refused as stale"}},
		{"a row that did not run", map[string]func(report.Row) report.Result{"none": oversold}, []string{"redis (did not run): server down"}},
		{"k6 failed", map[string]func(report.Row) report.Result{
			"redis": measured(func(r *report.Result) { r.K6Exit = 107 }), "none": oversold}, []string{"redis (BROKEN): k6 exited 107"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rep := report.Report{Results: quietRunner("redis", "none").judgedRows(context.Background(), fakeRows(c.results))}
			var stdout, stderr bytes.Buffer
			code := verdict(context.Background(), rep, &stdout, &stderr)
			if want := map[bool]int{true: 0, false: 1}[len(c.fails) == 0]; code != want {
				t.Errorf("exit %d, want %d; stderr:\n%s", code, want, stderr.String())
			}
			for _, f := range c.fails {
				if !strings.Contains(stderr.String(), "FAIL:\n") || !strings.Contains(stderr.String(), "  "+f) {
					t.Errorf("stderr does not list %q:\n%s", f, stderr.String())
				}
			}
			if pass := strings.HasPrefix(stdout.String(), "PASS"); pass != (len(c.fails) == 0) {
				t.Errorf("stdout %q", stdout.String())
			}
		})
	}
}

// An interrupted run fails even when every row it ran kept its promise:
// the rows it did not run were not shown to.
func TestAnInterruptedRunFails(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	results := map[string]func(report.Row) report.Result{"none": oversold, "redis": clean}
	run := func(ctx context.Context, s report.Row) (report.Result, error) {
		cancel() // Ctrl-C during the first row
		return fakeRows(results)(ctx, s)
	}
	rep := report.Report{Results: quietRunner("none", "redis", "etcd").judgedRows(ctx, run)}
	if len(rep.Results) != 1 || rep.Results[0].Spec.Name != "none" {
		t.Fatalf("rows run after the interrupt: %d", len(rep.Results))
	}
	var stdout, stderr bytes.Buffer
	if code := verdict(ctx, rep, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "interrupted") {
		t.Errorf("exit %d, stderr %q", code, stderr.String())
	}
}

// A row that could not run is reported as such, with nothing it measured
// before it failed, and the rows after it still run.
func TestARowThatFailsIsReportedAndTheOthersStillRun(t *testing.T) {
	results := quietRunner("redis", "none").judgedRows(context.Background(),
		fakeRows(map[string]func(report.Row) report.Result{"none": oversold}))
	if len(results) != 2 {
		t.Fatalf("%d results, want both rows", len(results))
	}
	failed := results[0]
	if failed.Verdict != report.VerdictDidNotRun || failed.Err != "server down" || failed.Sold != 0 {
		t.Errorf("failed row: verdict %q, err %q, sold %d", failed.Verdict, failed.Err, failed.Sold)
	}
	if failed.Spec.Name != "redis" || failed.Spec.Expect != report.ExpectClean {
		t.Errorf("failed row's spec %+v", failed.Spec)
	}
	if results[1].Verdict != report.VerdictDamage {
		t.Errorf("none: verdict %q", results[1].Verdict)
	}
}

// -flows narrows every row; a row left with none of its flows is not run.
func TestRowsLeftWithoutFlowsAreSkipped(t *testing.T) {
	rn := quietRunner("atomic-sql", "redis")
	rn.o.Flows = []string{"balance"}
	var ran []string
	rn.judgedRows(context.Background(), func(_ context.Context, s report.Row) (report.Result, error) {
		ran = append(ran, s.Name+":"+strings.Join(s.Flows, ","))
		return clean(s), nil
	})
	if len(ran) != 1 || ran[0] != "redis:balance" {
		t.Errorf("ran %v, want redis with the balance flow only", ran)
	}
}

// With -rate 0 a row offers -fraction of the rate it held, and its stock
// is cut to what half a phase sells at that rate, so that a working lock
// sells out.
func TestOfferingIsAFractionOfTheRateHeld(t *testing.T) {
	var o options
	o.Fraction, o.Duration = 0.7, 10*time.Second
	cases := []struct {
		held, stock     float64
		rate, wantStock int
	}{
		{held: 400, stock: 300, rate: 280, wantStock: 300}, // 280 × 5 s sells far more than the stock
		{held: 40, stock: 300, rate: 28, wantStock: 140},   // cut to 28 × 5 s
		{held: 1, stock: 300, rate: 1, wantStock: 5},       // at least one purchase a second
		{held: 0.1, stock: 0, rate: 1, wantStock: 1},       // at least one unit
	}
	for _, c := range cases {
		o.Stock = int(c.stock)
		got := o.offering(c.held)
		if got.Rate != c.rate || got.Stock != c.wantStock {
			t.Errorf("held %.1f, stock %.0f: rate %d stock %d, want %d and %d", c.held, c.stock, got.Rate, got.Stock, c.rate, c.wantStock)
		}
	}
	if o.Rate != 0 {
		t.Error("offering changed the run's own options")
	}
}

// A row given a rate, and an events row (which has no hot SKU to probe),
// run without the probe: they ask their instances for nothing.
func TestOnlyARowWithoutARateProbesItsCapacity(t *testing.T) {
	for _, c := range []struct {
		row        string
		rate, want int
	}{{"redis", 50, 50}, {"events", 0, eventsRate}, {"events", 20, 20}} {
		rn := quietRunner(c.row)
		rn.o.Rate, rn.o.Stock = c.rate, 200
		r := rn.newRow(rowSpec(c.row, 3, allFlows)) // no instances: a probe would fail
		var res report.Result
		if err := r.offerFraction(context.Background(), &res); err != nil {
			t.Errorf("%s at -rate %d: %v", c.row, c.rate, err)
		}
		if res.Rate != c.want || r.o.Rate != c.want || r.o.Stock != 200 || res.ProbedCapacity != 0 {
			t.Errorf("%s at -rate %d: offered %d (row %d), stock %d, probed %.0f", c.row, c.rate, res.Rate, r.o.Rate, r.o.Stock, res.ProbedCapacity)
		}
	}
}

// An unsafe row's errors are what it shows, so they cannot bound its
// probed rate; a safe row's error budget is the run's.
func TestOnlyAnUnsafeRowsProbeIgnoresErrors(t *testing.T) {
	var o options
	o.Probe.MaxErrors = 0.01
	if c := probeOptions(rowSpec("none", 3, allFlows), o.Probe); c.MaxErrors != 1 {
		t.Errorf("none's probe: error budget %g, want 1", c.MaxErrors)
	}
	if c := probeOptions(rowSpec("redis", 3, allFlows), o.Probe); c.MaxErrors != 0.01 {
		t.Errorf("redis's probe: error budget %g, want the run's 0.01", c.MaxErrors)
	}
}
