package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/lockbench/shop/internal/auth"
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

// newBuyer buys sku on the row's instances as users 1..users, with tokens
// signed by the row's secret.
func newBuyer(re *rowEnv, users int, sku string) (*capacity.Buyer, error) {
	a := auth.New([]byte(re.sec.jwt), re.sec.admin)
	tokens := make([]string, users)
	for u := range tokens {
		tok, err := a.Token(int64(u+1), 2*time.Hour, time.Now())
		if err != nil {
			return nil, err
		}
		tokens[u] = tok
	}
	return capacity.NewBuyer(re.urls, tokens, sku), nil
}

// offerer returns what offers one step of purchases with b, timing the
// CPU its instances and the runner spent on it.
func (re *rowEnv) offerer(ctx context.Context, b *capacity.Buyer, c capacity.Options) func(rate float64) capacity.Step {
	return func(rate float64) capacity.Step {
		service, runner := re.cpu(), selfCPU()
		s := b.Offer(ctx, rate, c.Step, c.SLO, c.MaxErrors)
		s.ServiceCPU, s.RunnerCPU = (re.cpu() - service).Seconds(), (selfCPU() - runner).Seconds()
		return s
	}
}

// cpu is the CPU the row's instances have used.
func (re *rowEnv) cpu() time.Duration {
	var sum time.Duration
	for _, pid := range re.pids() {
		sum += processCPU(pid)
	}
	return sum
}

// search runs the capacity search with offer, logging every step.
func search(ctx context.Context, log *slog.Logger, offer func(rate float64) capacity.Step, row string, c capacity.Options) ([]capacity.Step, float64) {
	return capacity.Search(ctx, c, func(rate float64, try int) capacity.Step {
		r := offer(rate)
		what := "capacity step"
		if try == capacity.Settle {
			what = "settle step"
		}
		log.Info(what, "row", row, "rate", fmt.Sprintf("%.0f", rate), "sold_per_s", fmt.Sprintf("%.0f", r.SalesPerS),
			"p99_ms", fmt.Sprintf("%.1f", r.P99), "errors", fmt.Sprintf("%.3f", r.ErrorRate), "held", r.WithinSLO, "try", try+1)
		return r
	})
}

// runCapacityRow measures one row: its ceiling, then the search, then the
// steps at twice and four times the rate held and the flooded step.
func runCapacityRow(ctx context.Context, log *slog.Logger, o options, env testEnv, s report.Row) (res report.CapacityRow, err error) {
	res = report.CapacityRow{Spec: s}
	re, err := startRow(ctx, log, o, env, s)
	if err != nil {
		return res, err
	}
	defer re.close()
	if err := re.adm.do(ctx, http.MethodPost, "/admin/v1/products",
		map[string]any{"sku": capacitySKU, "name": "capacity", "stock": 100_000_000, "price_cents": 1}, nil); err != nil {
		return res, err
	}
	if res.Ceiling, err = measureCeiling(ctx, o.ceiling, re.shop); err != nil {
		return res, err
	}
	log.Info("ceiling", "row", s.Name, "serialized_ms", fmt.Sprintf("%.2f", res.Ceiling.SerializedMicros/1000),
		"ceiling_per_s", fmt.Sprintf("%.0f", res.Ceiling.CeilingPerSec))
	b, err := newBuyer(re, o.Users, capacitySKU)
	if err != nil {
		return res, err
	}
	offer := re.offerer(ctx, b, o.Probe)
	for _, w := range capacity.WarmUp(ctx, o.Probe, offer) {
		log.Info("warm-up step", "row", s.Name, "rate", fmt.Sprintf("%.0f", w.Rate), "p99_ms", fmt.Sprintf("%.1f", w.P99),
			"errors", fmt.Sprintf("%.3f", w.ErrorRate), "held", w.WithinSLO)
	}
	res.Steps, res.Held = search(ctx, log, offer, s.Name, o.Probe)
	res.Rounds, res.Flood = pastCapacity(ctx, log, offer, s.Name, o.Probe, res.Held, res.Ceiling.CeilingPerSec)
	if s.Strategy == "optimistic" {
		if res.RetriesPerSale, err = retriesPerRequest(ctx, re.urls); err != nil {
			log.Warn("optimistic metrics", "row", s.Name, "err", err)
		}
	}
	return res, nil
}

// pastCapacity runs c.Rounds rounds past capacity (capacity.Round), each
// in the reverse order of the last, then the flood: a step at the ceiling
// if that is more than four times the rate held (the most a flood can
// offer this key).
func pastCapacity(ctx context.Context, log *slog.Logger, offer func(rate float64) capacity.Step, row string, c capacity.Options, held, ceiling float64) (rounds []capacity.Round, flood *capacity.Step) {
	step := func(what string, rate float64) capacity.Step {
		s := offer(rate)
		log.Info(what+" step", "row", row, "rate", fmt.Sprintf("%.0f", s.Rate), "sold_per_s", fmt.Sprintf("%.0f", s.SalesPerS),
			"p99_ms", fmt.Sprintf("%.1f", s.P99), "turned_away", fmt.Sprintf("%.2f", s.TurnedAway()))
		return s
	}
	for i := 0; held > 0 && i < c.Rounds && ctx.Err() == nil; i++ {
		var r capacity.Round
		steps := []struct {
			what string
			rate float64
			into *capacity.Step
		}{{"held", held, &r.AtHeld}, {"2x", 2 * held, &r.AtTwo}, {"4x", 4 * held, &r.AtFour}}
		if i%2 == 1 {
			slices.Reverse(steps)
		}
		for _, st := range steps {
			*st.into = step(st.what, st.rate)
		}
		if ctx.Err() != nil {
			break // a round cut short would judge steps that never ran
		}
		rounds = append(rounds, r)
	}
	if ctx.Err() == nil && (held == 0 || ceiling > 4*held) {
		s := step("flood", max(4*held, ceiling, c.Start))
		flood = &s
	}
	return rounds, flood
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

// retriesPerRequest sums the optimistic counters of every instance's
// /metrics: extra attempts per request that ended.
func retriesPerRequest(ctx context.Context, urls []string) (float64, error) {
	var attempts, requests float64
	for _, u := range urls {
		a, r, err := optimisticCounters(ctx, u)
		if err != nil {
			return 0, err
		}
		attempts, requests = attempts+a, requests+r
	}
	if requests == 0 {
		return 0, nil
	}
	return (attempts - requests) / requests, nil
}

// optimisticCounters reads one instance's optimistic attempts and requests
// on the stock.
func optimisticCounters(ctx context.Context, url string) (attempts, requests float64, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return 0, 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `domain="stock"`) {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		switch {
		case strings.HasPrefix(line, "shop_optimistic_attempts_total"):
			attempts += v
		case strings.HasPrefix(line, "shop_optimistic_requests_total"):
			requests += v
		}
	}
	return attempts, requests, sc.Err()
}

func runCapacity(ctx context.Context, log *slog.Logger, o options, env testEnv, m report.Machine) int {
	rep := report.CapacityReport{Options: o.Options, Machine: m, Command: command(os.Args[1:]), Commit: commit(ctx), At: time.Now().UTC()}
	rep.Load[0] = loadAverage()
	var err error
	if rep.BareRefusalMicros, err = measureBareRefusal(ctx, log, refuserCommand(o), o.Probe); err != nil {
		fmt.Fprintf(os.Stderr, "runner: the CPU of a bare refusal, which every row's verdict needs: %v\n", err)
		return 1
	}
	log.Info("bare refusal", "cpu_us", fmt.Sprintf("%.1f", rep.BareRefusalMicros))
	for _, name := range o.Rows {
		s := rowSpec(name, o.Instances, []string{"seckill"})
		log.Info("capacity row starting", "row", name, "backend", s.Backend, "strategy", s.Strategy)
		res, err := runCapacityRow(ctx, log, o, env, s)
		if err != nil {
			log.Error("row failed", "row", name, "err", err)
			res.Err = err.Error()
		}
		rep.Results = append(rep.Results, res)
		if ctx.Err() != nil {
			break
		}
	}
	rep.Load[1] = loadAverage()
	if err := writeCapacity(o, rep); err != nil {
		fmt.Fprintf(os.Stderr, "runner: %v\n", err)
		return 1
	}
	if failed := rep.Failed(); len(failed) > 0 {
		fmt.Fprintf(os.Stderr, "runner: capacity verdict fails %s (see the verdict column)\n", strings.Join(failed, ", "))
		return 1
	}
	return 0
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
