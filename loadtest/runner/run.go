package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lockbench/shop/loadtest/runner/capacity"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// runLoadTest runs every row's k6 flows, writes the report and judges the
// run: 0 when every row showed what its backend promises.
func (rn runner) runLoadTest(ctx context.Context, m report.Machine) int {
	rep := report.Report{Options: rn.o.Options, Machine: m, Command: command(os.Args[1:]), Commit: commit(ctx), At: time.Now().UTC()}
	rep.Results = rn.judgedRows(ctx, func(ctx context.Context, spec report.Row) (report.Result, error) {
		return rn.newRow(spec).run(ctx)
	})
	if err := writeReport(rn.o, rep); err != nil {
		fmt.Fprintf(os.Stderr, "runner: write report: %v\n", err)
		return 1
	}
	return verdict(ctx, rep, os.Stdout, os.Stderr)
}

// judgedRows runs the rows of -backends one after the other with run and
// judges each result; a row none of whose flows is in -flows is skipped.
func (rn runner) judgedRows(ctx context.Context, run func(context.Context, report.Row) (report.Result, error)) []report.Result {
	var results []report.Result
	for _, name := range rn.o.Rows {
		spec := rowSpec(name, rn.o.Instances, rn.o.Flows)
		if len(spec.Flows) == 0 {
			rn.log.Info("row skipped: none of its flows is in -flows", "row", name)
			continue
		}
		rn.log.Info("row starting", "row", name, "backend", spec.Backend, "strategy", spec.Strategy, "flows", strings.Join(spec.Flows, ","))
		res, err := run(ctx, spec)
		if err != nil {
			// A row that could not run is reported as such, and the
			// others still run: one backend's server being down should
			// not hide the rest of the comparison.
			rn.log.Error("row failed", "row", name, "err", err)
			res = report.Result{Spec: spec, Err: err.Error()}
		}
		res.Judge()
		results = append(results, res)
		if ctx.Err() != nil {
			break
		}
	}
	return results
}

func writeReport(o options, rep report.Report) error {
	if err := rep.Write(o.out); err != nil {
		return err
	}
	fmt.Print(rep.Table())
	fmt.Printf("\nreport: %s and %s\n", filepath.Join(o.out, "report.md"), filepath.Join(o.out, "report.html"))
	return record(o.record, "loadtest", rep.At, rep.Markdown())
}

// verdict prints what contradicted its row's promise and says how the run
// ends: 1 when a row did, or when the run was interrupted.
func verdict(ctx context.Context, rep report.Report, stdout, stderr io.Writer) int {
	if bad := rep.Failures(); len(bad) > 0 {
		fmt.Fprintln(stderr, "\nFAIL:")
		for _, b := range bad {
			fmt.Fprintln(stderr, "  "+b)
		}
		return 1
	}
	if ctx.Err() != nil {
		fmt.Fprintln(stderr, "runner: interrupted")
		return 1
	}
	fmt.Fprintln(stdout, "PASS: every lock row shows zero damage and every unsafe row shows some")
	return 0
}

// run runs the row from a fresh database to stopped instances.
func (r *row) run(ctx context.Context) (res report.Result, err error) {
	started := time.Now()
	res = report.Result{Spec: r.spec, Stock: int64(r.o.Stock)}
	if err := r.start(ctx); err != nil {
		return res, err
	}
	defer r.close()
	if err := r.offerFraction(ctx, &res); err != nil {
		return res, err
	}
	summaryPath := filepath.Join(r.o.out, r.spec.Name+".k6.json")
	_ = os.Remove(summaryPath)
	if err := r.runTraffic(ctx, summaryPath, &res); err != nil {
		return res, err
	}
	if err := readSummary(summaryPath, &res); err != nil {
		return res, err
	}
	res.AuditOK, res.Audit, err = r.adm.audit(ctx, filepath.Join(r.o.out, r.spec.Name+".audit.json"))
	if err != nil {
		return res, err
	}
	res.SecondsTaken = time.Since(started).Seconds()
	if r.spec.Strategy == "optimistic" {
		if res.RetriesPerSale, err = retriesPerRequest(ctx, r.urls); err != nil {
			r.log.Warn("optimistic metrics", "row", r.spec.Name, "err", err)
		}
	}
	r.log.Info("row done", "row", r.spec.Name, "sold", res.Sold, "orders_per_sec", fmt.Sprintf("%.1f", res.OrdersPerSec),
		"audit_ok", res.AuditOK, "damage", res.Damage(), "k6_exit", res.K6Exit)
	return res, nil
}

// runTraffic runs k6; for an events row it makes the faults meanwhile,
// then lets the events drain and measures them.
func (r *row) runTraffic(ctx context.Context, summaryPath string, res *report.Result) (err error) {
	if !r.spec.IsEvents() {
		res.K6Exit, err = r.runK6(ctx, summaryPath)
		return err
	}
	var faults []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		faults = r.faults(ctx)
	}()
	res.K6Exit, err = r.runK6(ctx, summaryPath)
	<-done
	if err != nil {
		return err
	}
	res.Events, err = r.settleEvents(ctx, faults)
	return err
}

// offerFraction sets the row's rate and stock when -rate is 0: it probes
// the row's capacity (the capacity search, on a SKU of its own, with the
// row's settings) and offers -fraction of it, so that every row runs below
// its own saturation on any machine.
func (r *row) offerFraction(ctx context.Context, res *report.Result) error {
	if r.spec.IsEvents() && r.o.Rate == 0 {
		// The orders flow alone: no hot SKU to probe.
		r.o.Rate = eventsRate
	}
	res.Rate = r.o.Rate
	if r.o.Rate > 0 {
		return nil
	}
	if err := r.adm.addProduct(ctx, product{SKU: capacitySKU, Name: "capacity probe", Stock: 100_000_000, PriceCents: 1}); err != nil {
		return err
	}
	p, err := r.prober(ctx, probeOptions(r.spec, r.o.Probe))
	if err != nil {
		return err
	}
	_, held := p.search(ctx)
	if held == 0 {
		return fmt.Errorf("capacity probe: not even %.0f purchases/s within the %s SLO", r.o.Probe.Start, r.o.Probe.SLO)
	}
	res.ProbedCapacity = held
	r.o = r.o.offering(held)
	res.Rate, res.Stock = r.o.Rate, int64(r.o.Stock)
	r.log.Info("offering a fraction of the probed capacity", "row", r.spec.Name, "capacity", fmt.Sprintf("%.0f", held), "rate", r.o.Rate, "stock", r.o.Stock)
	return r.adm.addProduct(ctx, product{SKU: hotSKU, Name: "Load test hot item", Stock: r.o.Stock, PriceCents: 1_000})
}

// probeOptions are the capacity search's options for the row's probe. An
// unsafe row's errors are its point (local's fences refuse the other
// processes' writes): only the latency bounds its rate.
func probeOptions(s report.Row, c capacity.Options) capacity.Options {
	if s.Expect == report.ExpectDamage {
		c.MaxErrors = 1
	}
	return c
}

// offering is o at -fraction of the rate held. The stock is cut to what
// half the phase sells at that rate, so that a working lock always sells
// out.
func (o options) offering(held float64) options {
	o.Rate = max(1, int(o.Fraction*held))
	o.Stock = max(1, min(o.Stock, int(float64(o.Rate)*o.Duration.Seconds()/2)))
	return o
}
