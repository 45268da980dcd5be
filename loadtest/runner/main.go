// Command runner is shop's load test: for each lock backend in turn it
// starts N shop instances on loopback against the shared test servers,
// resets the fixture, runs the k6 flows (loadtest/k6/shop.js) spread over
// the instances, reads the audit, and stops the instances. Then it writes
// loadtest/results/report.md and report.html and prints the table.
//
// It exits 1 when a row contradicts what its backend promises: a lock that
// let damage through, or a `none` baseline that showed none (a load too
// light to race proves nothing). `make loadtest-smoke` relies on that.
//
//	go run ./loadtest/runner -backends "none redis" -duration 5s
//
// docs/loadtest.md explains the options and how to read the report.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/lockbench/shop/internal/lockkit/registry"
)

// allRows is what -backends all runs: every registered backend, then the
// lock-free strategies as reference rows.
var allRows = append(registry.Names(), referenceRows...)

// options are the knobs of one run; every row of a report shares them.
type options struct {
	Rows      []string      `json:"rows"`
	Instances int           `json:"instances"`
	Duration  time.Duration `json:"duration"`
	Rate      int           `json:"rate"`
	Delay     time.Duration `json:"delay"`
	Stock     int           `json:"stock"`
	MaxVUs    int           `json:"max_vus"`
	Users     int           `json:"users"`
	Flows     []string      `json:"flows"`

	// Fraction is the share of each row's probed capacity the load test
	// offers when Rate is 0 (the default), so that its verdict does not
	// depend on the machine's speed.
	Fraction float64 `json:"fraction,omitempty"`
	// Probe is the capacity search each row runs first when Rate is 0.
	Probe capacityOptions `json:"probe"`

	shop, k6, script, out string
	keep                  bool
	// capacity: run the capacity search instead of k6 (-capacity).
	capacity bool
}

func main() {
	os.Exit(run())
}

func run() int {
	var o options
	var backends, flows string
	flag.StringVar(&backends, "backends", "all", "rows to run, space- or comma-separated: backends of SHOP_LOCK_BACKEND, atomic-sql, atomic-redis, or all")
	flag.IntVar(&o.Instances, "instances", 3, "shop instances per row")
	flag.DurationVar(&o.Duration, "duration", 15*time.Second, "length of each k6 phase (seckill, then the other flows)")
	flag.IntVar(&o.Rate, "rate", 0, "seckill purchases per second; the balance and like flows get rate/2, orders rate/5; 0: -fraction of each row's probed capacity")
	flag.Float64Var(&o.Fraction, "fraction", 0.7, "with -rate 0, the share of each row's probed capacity to offer")
	flag.BoolVar(&o.capacity, "capacity", false, "measure each row's capacity (highest rate within -slo) beside its ceiling, instead of the k6 flows")
	flag.DurationVar(&o.Probe.SLO, "slo", 250*time.Millisecond, "capacity: p99 of a successful purchase must stay within it")
	flag.Float64Var(&o.Probe.MaxErrors, "max-errors", 0.01, "capacity: fraction of answers other than 201 a step may have")
	flag.DurationVar(&o.Probe.Step, "step", 3*time.Second, "capacity: length of each rate step")
	flag.Float64Var(&o.Probe.Start, "start-rate", 20, "capacity: first rate, purchases/s")
	flag.Float64Var(&o.Probe.Factor, "factor", 1.25, "capacity: each step offers this times the previous rate")
	flag.IntVar(&o.Probe.Refine, "refine", 2, "capacity: once a step breaks, halve the gap to the last rate held this many times")
	flag.Float64Var(&o.Probe.Max, "max-rate", 3000, "capacity: highest rate tried")
	flag.DurationVar(&o.Delay, "delay", 10*time.Millisecond, "SHOP_CRITICAL_SECTION_DELAY: business work inside every read-modify-write")
	flag.IntVar(&o.Stock, "stock", 200, "stock of the hot SKU (keep it well below rate*duration so that it sells out)")
	flag.IntVar(&o.MaxVUs, "max-vus", 400, "most k6 VUs per scenario (waiting requests hold one each)")
	flag.IntVar(&o.Users, "users", 500, "users to mint tokens for (the loadtest fixture has 1000)")
	flag.StringVar(&flows, "flows", strings.Join(allFlows, ","), "flows to run (the reference rows run only seckill)")
	flag.StringVar(&o.shop, "shop", "bin/shop", "shop binary (make loadtest builds it)")
	flag.StringVar(&o.k6, "k6", "bin/k6", "k6 binary (make k6 builds it)")
	flag.StringVar(&o.script, "script", "loadtest/k6/shop.js", "k6 script")
	flag.StringVar(&o.out, "out", "loadtest/results", "directory for results, logs and the report (created if missing)")
	flag.BoolVar(&o.keep, "keep", false, "keep each row's database (shop_lt_*) for inspection")
	render := flag.String("render", "", "run nothing: render report.md and report.html again from this results.json")
	flag.Parse()
	if *render != "" {
		return rerender(*render)
	}

	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if o.capacity && !flagSet("delay") {
		o.Delay = 0 // the capacity of the service itself, with no artificial work
	}
	rows, err := parseRows(backends, o.capacity)
	if err == nil {
		o.Flows, err = parseFlows(flows)
	}
	if err == nil {
		err = o.validate()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 2
	}
	o.Rows = rows
	env, err := loadTestEnv(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if err := os.MkdirAll(filepath.Join(o.out, "logs"), 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 1
	}
	if err := env.sweep(ctx); err != nil {
		log.Warn("could not drop the databases of earlier, interrupted runs", "err", err)
	}
	machine := describeMachine(ctx, o.k6)
	if o.capacity {
		return runCapacity(ctx, log, o, env, machine)
	}
	var results []result
	for _, name := range rows {
		spec := rowSpec(name, o.Instances, o.Flows)
		if len(spec.Flows) == 0 {
			log.Info("row skipped: none of its flows is in -flows", "row", name)
			continue
		}
		log.Info("row starting", "row", name, "backend", spec.Backend, "strategy", spec.Strategy, "flows", strings.Join(spec.Flows, ","))
		res, err := runRow(ctx, log, o, env, spec)
		if err != nil {
			// A row that could not run is reported as such, and the
			// others still run: one backend's server being down should
			// not hide the rest of the comparison.
			log.Error("row failed", "row", name, "err", err)
			res = result{Spec: spec, Err: err.Error()}
		}
		res.judge()
		results = append(results, res)
		if ctx.Err() != nil {
			break
		}
	}

	rep := report{Options: o, Machine: machine, Results: results, Command: command(os.Args[1:]), At: time.Now().UTC()}
	if err := rep.write(o.out); err != nil {
		fmt.Fprintf(os.Stderr, "runner: write report: %v\n", err)
		return 1
	}
	fmt.Print(rep.table())
	fmt.Printf("\nreport: %s and %s\n", filepath.Join(o.out, "report.md"), filepath.Join(o.out, "report.html"))

	if bad := rep.failures(); len(bad) > 0 {
		fmt.Fprintln(os.Stderr, "\nFAIL:")
		for _, b := range bad {
			fmt.Fprintln(os.Stderr, "  "+b)
		}
		return 1
	}
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "runner: interrupted")
		return 1
	}
	fmt.Println("PASS: every lock row shows zero damage and every unsafe row shows some")
	return 0
}

// rerender writes the report of an earlier run again, next to its
// results.json, for when the report's shape changed but the numbers did not.
func rerender(path string) int {
	b, err := os.ReadFile(path)
	if err == nil {
		var rep report
		if err = json.Unmarshal(b, &rep); err == nil {
			for i := range rep.Results {
				rep.Results[i].judge()
			}
			err = rep.write(filepath.Dir(path))
			fmt.Print(rep.table())
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 1
	}
	return 0
}

// command is how to repeat this run, for the report.
func command(args []string) string {
	parts := []string{"go run ./loadtest/runner"}
	for _, a := range args {
		if a == "" || strings.ContainsAny(a, " \t'\"$") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

func parseRows(s string, capacity bool) ([]string, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
	if len(fields) == 0 || (len(fields) == 1 && fields[0] == "all") {
		if capacity {
			return capacityRows, nil
		}
		return allRows, nil
	}
	for _, f := range fields {
		if !isRow(f) {
			return nil, fmt.Errorf("-backends has %q; want some of %s, or a lock backend + %q", f, strings.Join(allRows, " "), combinedSuffix)
		}
	}
	return fields, nil
}

func parseFlows(s string) ([]string, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
	for _, f := range fields {
		if !slices.Contains(allFlows, f) {
			return nil, fmt.Errorf("-flows has %q; want some of %s", f, strings.Join(allFlows, ","))
		}
	}
	if len(fields) == 0 {
		return nil, errors.New("-flows is empty")
	}
	return fields, nil
}

func isRow(name string) bool {
	if base, ok := strings.CutSuffix(name, combinedSuffix); ok {
		return slices.Contains(capacityRows, base) && baseSpec(base, 1).Strategy == "lock"
	}
	return slices.Contains(allRows, name)
}

func (o options) validate() error {
	var errs []error
	if o.Instances < 1 || o.Instances > 8 {
		errs = append(errs, fmt.Errorf("-instances is %d; want 1 to 8", o.Instances))
	}
	// Bounded in time and count: a typo must not turn into an hour of load.
	if o.Duration < time.Second || o.Duration > 10*time.Minute {
		errs = append(errs, fmt.Errorf("-duration is %s; want 1s to 10m", o.Duration))
	}
	if o.Rate < 0 || o.Rate > 5000 {
		errs = append(errs, fmt.Errorf("-rate is %d; want 1 to 5000, or 0 for -fraction of the probed capacity", o.Rate))
	}
	if o.Fraction <= 0 || o.Fraction > 1 {
		errs = append(errs, fmt.Errorf("-fraction is %g; want above 0, at most 1", o.Fraction))
	}
	p := o.Probe
	if p.SLO <= 0 || p.Step < 500*time.Millisecond || p.Start < 1 || p.Factor <= 1 || p.Max < p.Start || p.MaxErrors < 0 || p.MaxErrors >= 1 || p.Refine < 0 || p.Refine > 8 {
		errs = append(errs, fmt.Errorf("capacity search %+v: want -slo > 0, -step >= 500ms, -start-rate >= 1, -factor > 1, -max-rate >= -start-rate, 0 <= -max-errors < 1, 0 <= -refine <= 8", p))
	}
	if o.Delay < 0 || o.Delay > 5*time.Second {
		errs = append(errs, fmt.Errorf("-delay is %s; want 0 to 5s", o.Delay))
	}
	if o.Stock < 1 {
		errs = append(errs, fmt.Errorf("-stock is %d; want at least 1", o.Stock))
	}
	if o.MaxVUs < 1 || o.MaxVUs > 2000 {
		errs = append(errs, fmt.Errorf("-max-vus is %d; want 1 to 2000", o.MaxVUs))
	}
	if o.Users < 300 || o.Users > 1000 {
		errs = append(errs, fmt.Errorf("-users is %d; want 300 to 1000 (the flows use users 1..300, the fixture has 1000)", o.Users))
	}
	return errors.Join(errs...)
}

// flagSet reports whether the flag was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
