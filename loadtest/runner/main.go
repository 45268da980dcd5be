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
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"

	"github.com/lockbench/shop/internal/lockkit/registry"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// allRows is what -backends all runs: every registered backend, the
// lock-free strategies as reference rows, then the ways of the events.
var allRows = append(append(registry.Names(), referenceRows...), eventsRows...)

// options are the knobs of one run: what the report records, and where
// the runner finds its tools and puts its output.
type options struct {
	report.Options

	shop, k6, script, out string
	// ceiling is the command that times one row's serialized window, run
	// with the row's environment; its last line of output is JSON.
	ceiling string
	// record: a directory where a dated copy of the report is kept
	// (docs/results for make loadtest and make capacity).
	record string
	keep   bool
	// capacity: run the capacity search instead of k6 (-capacity).
	capacity bool
	// render: run nothing, render the report of this results.json again.
	render string
}

func main() {
	os.Exit(run())
}

func run() int {
	o, err := parseOptions()
	if err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 2
	}
	if o.render != "" {
		return rerender(o.render, o.record)
	}
	env, err := loadTestEnv(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	if err := os.MkdirAll(filepath.Join(o.out, "logs"), 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 1
	}
	if err := env.mariadb.sweep(ctx); err != nil {
		log.Warn("could not drop the databases of earlier, interrupted runs", "err", err)
	}
	rn := runner{o: o, env: env, log: log}
	machine := describeMachine(ctx, o.k6)
	if o.capacity {
		return rn.runCapacity(ctx, machine)
	}
	return rn.runLoadTest(ctx, machine)
}

// runner is what every row of one run shares: the options, the test
// servers and the log.
type runner struct {
	o   options
	env testEnv
	log *slog.Logger
}

// parseOptions reads the flags and checks them.
func parseOptions() (options, error) {
	var o options
	var backends, flows string
	flag.StringVar(&backends, "backends", "all", "rows to run, space- or comma-separated: backends of SHOP_LOCK_BACKEND, atomic-sql, atomic-redis, or all")
	flag.StringVar(&flows, "flows", strings.Join(allFlows, ","), "flows to run (the reference rows run only seckill)")
	o.bindRun(flag.CommandLine)
	o.bindProbe(flag.CommandLine)
	o.bindPaths(flag.CommandLine)
	flag.Parse()
	if o.render != "" {
		return o, nil
	}
	if o.ceiling == "" {
		o.ceiling = filepath.Join(filepath.Dir(o.shop), "ceiling")
	}
	if o.capacity && !flagSet("delay") {
		o.Delay = 0 // the capacity of the service itself, with no artificial work
	}
	var err error
	if o.Rows, err = parseRows(backends, o.capacity); err != nil {
		return o, err
	}
	if o.Flows, err = parseFlows(flows); err != nil {
		return o, err
	}
	return o, o.validate()
}

func (o *options) bindRun(fs *flag.FlagSet) {
	fs.IntVar(&o.Instances, "instances", 3, "shop instances per row")
	fs.DurationVar(&o.Duration, "duration", 15*time.Second, "length of each k6 phase (seckill, then the other flows)")
	fs.IntVar(&o.Rate, "rate", 0, "seckill purchases per second; the balance and like flows get rate/2, orders rate/5; 0: -fraction of each row's probed capacity")
	fs.Float64Var(&o.Fraction, "fraction", 0.7, "with -rate 0, the share of each row's probed capacity to offer")
	fs.DurationVar(&o.Delay, "delay", 10*time.Millisecond, "SHOP_CRITICAL_SECTION_DELAY: business work inside every read-modify-write")
	fs.IntVar(&o.Stock, "stock", 200, "stock of the hot SKU (keep it well below rate*duration so that it sells out)")
	fs.IntVar(&o.MaxVUs, "max-vus", 400, "most k6 VUs per scenario (waiting requests hold one each)")
	fs.IntVar(&o.Users, "users", 500, "users to mint tokens for (the loadtest fixture has 1000)")
}

func (o *options) bindProbe(fs *flag.FlagSet) {
	fs.BoolVar(&o.capacity, "capacity", false, "measure each row's capacity (highest rate within -slo) beside its ceiling, instead of the k6 flows")
	fs.DurationVar(&o.Probe.SLO, "slo", 250*time.Millisecond, "capacity: p99 of a successful purchase must stay within it")
	fs.Float64Var(&o.Probe.MaxErrors, "max-errors", 0.01, "capacity: fraction of answers other than 201 a step may have")
	fs.DurationVar(&o.Probe.Step, "step", 3*time.Second, "capacity: length of each rate step")
	fs.Float64Var(&o.Probe.Start, "start-rate", 20, "capacity: first rate, purchases/s")
	fs.Float64Var(&o.Probe.Factor, "factor", 1.25, "capacity: each step offers this times the previous rate")
	fs.IntVar(&o.Probe.Refine, "refine", 2, "capacity: once a step breaks, halve the gap to the last rate held this many times")
	fs.Float64Var(&o.Probe.Max, "max-rate", 3000, "capacity: highest rate tried")
	fs.IntVar(&o.Probe.WarmUp, "warm-up", 5, "capacity: before each row's search, offer -start-rate for up to this many steps until one holds, results discarded")
	fs.IntVar(&o.Probe.Rounds, "rounds", 3, "capacity: rounds of the rate held, 2× and 4× it, in alternating order; the verdict reads their medians")
}

func (o *options) bindPaths(fs *flag.FlagSet) {
	fs.StringVar(&o.shop, "shop", "bin/shop", "shop binary (make loadtest builds it)")
	fs.StringVar(&o.k6, "k6", "bin/k6", "k6 binary (make k6 builds it)")
	fs.StringVar(&o.ceiling, "ceiling", "", "capacity: command (binary and its first arguments) that times one row's serialized window with the row's SHOP_* environment; default: the ceiling binary beside -shop (make loadtest-shop builds both)")
	fs.StringVar(&o.script, "script", "loadtest/k6/shop.js", "k6 script")
	fs.StringVar(&o.out, "out", "loadtest/results", "directory for results, logs and the report (created if missing)")
	fs.StringVar(&o.record, "record", "", "also keep a dated copy of the Markdown report in this directory (loadtest-<date>.md, capacity-<date>.md)")
	fs.BoolVar(&o.keep, "keep", false, "keep each row's database (shop_lt_*) for inspection")
	fs.StringVar(&o.render, "render", "", "run nothing: render report.md and report.html again from this results.json")
}

// record keeps a dated copy of a report in dir, for docs/results: the
// make targets that measure write their own record.
func record(dir, kind string, at time.Time, markdown string) error {
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	path := filepath.Join(dir, kind+"-"+at.Format("2006-01-02")+".md")
	fmt.Printf("record: %s\n", path)
	return os.WriteFile(path, []byte(markdown), 0o644)
}

// rerender writes the report of an earlier run again, next to its
// results.json (and its dated record, with -record), for when the report's
// shape changed but the numbers did not. The rows' verdicts and fences
// are taken again from this code.
func rerender(path, recordDir string) int {
	b, err := os.ReadFile(path)
	if err == nil {
		var rep report.Report
		if err = json.Unmarshal(b, &rep); err == nil {
			for i := range rep.Results {
				rep.Results[i].Spec.NoFence = baseSpec(rep.Results[i].Spec.Name, rep.Options.Instances).NoFence
				rep.Results[i].Judge()
			}
			if err = rep.Write(filepath.Dir(path)); err == nil {
				err = record(recordDir, "loadtest", rep.At, rep.Markdown())
			}
			fmt.Print(rep.Table())
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 1
	}
	return 0
}

// command is how to repeat this run, for the report: from the repository,
// where `go run ./loadtest/runner` runs, so a path inside it (the
// Makefile passes $(BIN)/shop, absolute) is written relative to it and
// the record names no directory of the machine it ran on.
func command(args []string) string {
	parts := []string{"go run ./loadtest/runner"}
	var inRepo *regexp.Regexp // a path that starts an argument, a value or a word
	if wd, err := os.Getwd(); err == nil && wd != "/" {
		inRepo = regexp.MustCompile(`(^|[ =])` + regexp.QuoteMeta(wd+string(filepath.Separator)))
	}
	for _, a := range args {
		if inRepo != nil {
			a = inRepo.ReplaceAllString(a, "$1")
		}
		if a == "" || strings.ContainsAny(a, " \t'\"$") {
			a = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
		}
		parts = append(parts, a)
	}
	return strings.Join(parts, " ")
}

// flagSet reports whether the flag was given on the command line.
func flagSet(name string) bool {
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
