package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/lockbench/shop/loadtest/runner/capacity"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// capacityRows are what -capacity all measures: every backend that holds
// across processes, the lock-free strategies, and three lock rows again
// with the buyers of the hot SKU combined under one grant.
var capacityRows = append(append(crossProcessNames(), referenceRows...),
	"redis+combined", "mysql-forupdate+combined", "zookeeper+combined")

// capacitySKU is the hot SKU of the capacity run, with more stock than any
// step can sell: the run measures sales, not sold-out answers.
const capacitySKU = "lt-capacity"

// runCapacity measures the CPU of a bare refusal, then every row's
// capacity, writes the capacity report and judges it: 0 when every row
// passes the capacity verdict.
func (rn runner) runCapacity(ctx context.Context, m report.Machine) int {
	rep := report.CapacityReport{Options: rn.o.Options, Machine: m, Command: command(os.Args[1:]), Commit: commit(ctx), At: time.Now().UTC()}
	rep.Load[0] = loadAverage()
	var err error
	if rep.BareRefusalMicros, err = measureBareRefusal(ctx, rn.log, refuserCommand(rn.o), rn.o.Probe); err != nil {
		fmt.Fprintf(os.Stderr, "runner: the CPU of a bare refusal, which every row's verdict needs: %v\n", err)
		return 1
	}
	rn.log.Info("bare refusal", "cpu_us", fmt.Sprintf("%.1f", rep.BareRefusalMicros))
	rep.Results = rn.measuredRows(ctx, func(ctx context.Context, spec report.Row) (report.CapacityRow, error) {
		return rn.newRow(spec).measureCapacity(ctx)
	})
	rep.Load[1] = loadAverage()
	if err := writeCapacity(rn.o, rep); err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 1
	}
	return capacityVerdict(rep, os.Stderr)
}

// measuredRows measures the rows of -backends, the seckill alone, one
// after the other; a row that fails keeps what it measured and its error.
func (rn runner) measuredRows(ctx context.Context, measure func(context.Context, report.Row) (report.CapacityRow, error)) []report.CapacityRow {
	var results []report.CapacityRow
	for _, name := range rn.o.Rows {
		s := rowSpec(name, rn.o.Instances, []string{"seckill"})
		rn.log.Info("capacity row starting", "row", name, "backend", s.Backend, "strategy", s.Strategy)
		res, err := measure(ctx, s)
		if err != nil {
			rn.log.Error("row failed", "row", name, "err", err)
			res.Err = err.Error()
		}
		results = append(results, res)
		if ctx.Err() != nil {
			break
		}
	}
	return results
}

// capacityVerdict names the rows that fail the capacity verdict and says
// how the run ends.
func capacityVerdict(rep report.CapacityReport, stderr io.Writer) int {
	if failed := rep.Failed(); len(failed) > 0 {
		fmt.Fprintf(stderr, "runner: capacity verdict fails %s (see the verdict column)\n", strings.Join(failed, ", "))
		return 1
	}
	return 0
}

// measureCapacity measures the row: its ceiling, then the warm-up, the
// search, the rounds at twice and four times the rate held and the flood.
func (r *row) measureCapacity(ctx context.Context) (res report.CapacityRow, err error) {
	res = report.CapacityRow{Spec: r.spec}
	if err := r.start(ctx); err != nil {
		return res, err
	}
	defer r.close()
	if err := r.adm.addProduct(ctx, product{SKU: capacitySKU, Name: "capacity", Stock: 100_000_000, PriceCents: 1}); err != nil {
		return res, err
	}
	if res.Ceiling, err = measureCeiling(ctx, r.o.ceiling, r.toolEnv); err != nil {
		return res, err
	}
	r.log.Info("ceiling", "row", r.spec.Name, "serialized_ms", fmt.Sprintf("%.2f", res.Ceiling.SerializedMicros/1000),
		"ceiling_per_s", fmt.Sprintf("%.0f", res.Ceiling.CeilingPerSec))
	p, err := r.prober(ctx, r.o.Probe)
	if err != nil {
		return res, err
	}
	p.measure(ctx, &res)
	if r.spec.Strategy == "optimistic" {
		if res.RetriesPerSale, err = retriesPerRequest(ctx, r.urls); err != nil {
			r.log.Warn("optimistic metrics", "row", r.spec.Name, "err", err)
		}
	}
	return res, nil
}

// prober offers steps of c's length of purchases of capacitySKU on the
// row's instances, as users 1..-users, timing the CPU the instances and
// the runner spend on each.
func (r *row) prober(ctx context.Context, c capacity.Options) (prober, error) {
	tokens, err := r.sec.userTokens(r.o.Users)
	if err != nil {
		return prober{}, err
	}
	b := capacity.NewBuyer(r.urls, tokens, capacitySKU)
	offer := func(rate float64) capacity.Step {
		held, holds, before := r.stockHolds(ctx)
		service, runner := r.cpu(), selfCPU()
		s := b.Offer(ctx, rate, c.Step, c.SLO, c.MaxErrors)
		s.ServiceCPU, s.RunnerCPU = (r.cpu() - service).Seconds(), (selfCPU() - runner).Seconds()
		if heldAfter, holdsAfter, after := r.stockHolds(ctx); before && after {
			s.LockHeldS, s.LockHolds = heldAfter-held, int(holdsAfter-holds)
		}
		return s
	}
	return prober{log: r.log, row: r.spec.Name, c: c, offer: offer}, nil
}

// stockHolds is how long the row's instances have held stock locks, in
// seconds, and how many grants that was, from their /metrics (zeros on a
// lock-free row); not ok if an instance did not answer.
func (r *row) stockHolds(ctx context.Context) (seconds, grants float64, ok bool) {
	const stock = `class="stock"`
	for _, u := range r.urls {
		lines, err := scrape(ctx, u)
		if err != nil {
			r.log.Warn("lock hold metrics", "row", r.spec.Name, "err", err)
			return 0, 0, false
		}
		seconds += sumSamples(lines, "shop_lock_hold_seconds_sum", stock)
		grants += sumSamples(lines, "shop_lock_hold_seconds_count", stock)
	}
	return seconds, grants, true
}

// cpu is the CPU the row's instances have used.
func (r *row) cpu() time.Duration {
	var sum time.Duration
	for _, pid := range r.pids() {
		sum += processCPU(pid)
	}
	return sum
}

// loadAverage is /proc/loadavg's three load averages, "" where there is none.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); err == nil && len(f) >= 3 {
		return strings.Join(f[:3], ", ")
	}
	return ""
}

// measureCeiling runs the ceiling command (-ceiling) with the row's
// environment: the same servers, database and key prefix as its instances.
func measureCeiling(ctx context.Context, command string, env []string) (capacity.Ceiling, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	argv := append(strings.Fields(command), "-n", "300")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return capacity.Ceiling{}, fmt.Errorf("%s: %w: %s", command, err, tail(stderr.Bytes()))
	}
	var c capacity.Ceiling
	if err := json.Unmarshal(bytes.TrimSpace(lastLine(out)), &c); err != nil {
		return c, fmt.Errorf("%s printed %q: %w", command, tail(out), err)
	}
	return c, nil
}

func lastLine(b []byte) []byte {
	lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
	return lines[len(lines)-1]
}

func writeCapacity(o options, rep report.CapacityReport) error {
	md := rep.Markdown()
	b, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return err
	}
	for path, data := range map[string][]byte{"capacity.json": b, "capacity.md": []byte(md)} {
		if err := os.WriteFile(filepath.Join(o.out, path), data, 0o644); err != nil {
			return err
		}
	}
	fmt.Print(md)
	fmt.Printf("\nreport: %s\n", filepath.Join(o.out, "capacity.md"))
	return record(o.record, "capacity", rep.At, md)
}
