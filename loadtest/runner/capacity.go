package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockbench/shop/internal/auth"
)

// capacityRows are what -capacity all measures: every backend that holds
// across processes, the lock-free strategies, and three lock rows again
// with the buyers of the hot SKU combined under one grant.
var capacityRows = append(append(crossProcessNames(), referenceRows...),
	"redis+combined", "mysql-forupdate+combined", "zookeeper+combined")

// capacityOptions are the knobs of the search for the highest rate held.
type capacityOptions struct {
	SLO       time.Duration `json:"slo"`        // p99 of a successful purchase must stay within it
	MaxErrors float64       `json:"max_errors"` // fraction of answers other than 201 allowed
	Step      time.Duration `json:"step"`       // length of each rate step
	Start     float64       `json:"start_rate"` // first rate offered, purchases/s
	Factor    float64       `json:"factor"`     // each step offers this times the previous rate
	Refine    int           `json:"refine"`     // halvings of the last step's gap once a step breaks
	Max       float64       `json:"max_rate"`   // the search stops here
}

// stepResult is one rate offered for one step.
type stepResult struct {
	Rate       float64 `json:"rate"`
	Offered    int     `json:"offered"`
	Sold       int     `json:"sold"`
	Busy       int     `json:"busy_503"`
	Other      int     `json:"other_errors"`
	ErrorRate  float64 `json:"error_rate"`
	P50        float64 `json:"p50_ms"`
	P99        float64 `json:"p99_ms"`
	SalesPerS  float64 `json:"sales_per_sec"`
	WithinSLO  bool    `json:"within_slo"`
	FirstError string  `json:"first_error,omitempty"`
}

// ceilingResult is what the ceiling tool printed for the row.
type ceilingResult struct {
	Window           string  `json:"window"`
	SerializedMicros float64 `json:"serialized_us_median"`
	CeilingPerSec    float64 `json:"ceiling_per_sec"`
}

// capacityResult is one row of the capacity report.
type capacityResult struct {
	Spec    spec          `json:"spec"`
	Ceiling ceilingResult `json:"ceiling"`
	Steps   []stepResult  `json:"steps"`
	// Held is the highest rate whose step stayed within the SLO and the
	// error budget; Overload is the step at twice that rate.
	Held     float64     `json:"held_rate"`
	Overload *stepResult `json:"overload,omitempty"`
	// Flood is a step at the row's ceiling (at least 4x held): how many
	// sales per second the key still makes when offered more than it can
	// take, the rest turned away.
	Flood *stepResult `json:"flood,omitempty"`
	// RetriesPerSale is the optimistic strategy's extra attempts per
	// request that ended (0 for the others).
	RetriesPerSale float64 `json:"retries_per_sale,omitempty"`
	Err            string  `json:"error,omitempty"`
}

// buyer sends purchases of one SKU, round-robin over the instances, as
// users 1..n.
type buyer struct {
	urls   []string
	tokens []string
	sku    string
	client *http.Client
}

func newBuyer(urls []string, sec secrets, users int, sku string) (*buyer, error) {
	a := auth.New([]byte(sec.jwt), sec.admin)
	b := &buyer{urls: urls, sku: sku, client: &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 4096, IdleConnTimeout: time.Minute},
	}}
	for u := 1; u <= users; u++ {
		tok, err := a.Token(int64(u), 2*time.Hour, time.Now())
		if err != nil {
			return nil, err
		}
		b.tokens = append(b.tokens, tok)
	}
	return b, nil
}

// offer sends rate purchases per second for d, open loop: each request
// leaves at its scheduled time whether or not earlier ones have answered,
// and its latency counts from that time, so a slow server cannot slow the
// clock that measures it (no coordinated omission).
func (b *buyer) offer(ctx context.Context, rate float64, d time.Duration, slo time.Duration, maxErrors float64) stepResult {
	n := int(math.Round(rate * d.Seconds()))
	interval := time.Duration(float64(time.Second) / rate)
	type sample struct {
		status int
		took   time.Duration
		err    string
	}
	samples := make([]sample, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if wait := time.Until(at); wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				n = i
			}
		}
		if ctx.Err() != nil {
			break
		}
		wg.Go(func() {
			status, err := b.purchase(ctx, i)
			s := sample{status: status, took: time.Since(at)}
			if err != nil {
				s.err = err.Error()
			}
			samples[i] = s
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	samples = samples[:n]

	r := stepResult{Rate: rate, Offered: n}
	var sold []time.Duration
	for _, s := range samples {
		switch {
		case s.status == http.StatusCreated:
			r.Sold++
			sold = append(sold, s.took)
		case s.status == http.StatusServiceUnavailable:
			r.Busy++
		default:
			r.Other++
			if r.FirstError == "" {
				r.FirstError = fmt.Sprintf("status %d %s", s.status, s.err)
			}
		}
	}
	slices.Sort(sold)
	r.P50, r.P99 = msOf(pct(sold, 0.50)), msOf(pct(sold, 0.99))
	if n > 0 {
		r.ErrorRate = float64(r.Busy+r.Other) / float64(n)
	}
	r.SalesPerS = float64(r.Sold) / elapsed.Seconds()
	r.WithinSLO = r.Sold > 0 && r.P99 <= msOf(slo) && r.ErrorRate <= maxErrors
	return r
}

func (b *buyer) purchase(ctx context.Context, i int) (int, error) {
	url := b.urls[i%len(b.urls)] + "/api/v1/seckill/" + b.sku + "/purchase"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"quantity":1}`))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+b.tokens[i%len(b.tokens)])
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, err
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusServiceUnavailable {
		return resp.StatusCode, fmt.Errorf("%s", tail(body.Bytes()))
	}
	return resp.StatusCode, nil
}

// search raises the rate step by step until a step breaks the SLO or the
// error budget, then narrows the gap between the last rate held and the
// first broken one by c.Refine geometric halvings, so that the rate held
// is known to within Factor^(1/2^Refine) (1.06 with the defaults) rather
// than to a whole step. It returns the steps and the highest rate held. A
// step that breaks it is run once more before it counts as broken: on a
// shared machine one stall of a neighbour can break a step that the
// service holds.
func (b *buyer) search(ctx context.Context, log *slog.Logger, row string, c capacityOptions) (steps []stepResult, held float64) {
	return searchRates(ctx, c, func(rate float64, try int) stepResult {
		r := b.offer(ctx, rate, c.Step, c.SLO, c.MaxErrors)
		log.Info("capacity step", "row", row, "rate", fmt.Sprintf("%.0f", rate), "sold_per_s", fmt.Sprintf("%.0f", r.SalesPerS),
			"p99_ms", fmt.Sprintf("%.1f", r.P99), "errors", fmt.Sprintf("%.3f", r.ErrorRate), "held", r.WithinSLO, "try", try+1)
		return r
	})
}

// searchRates is search's logic, with the step offered by offer.
func searchRates(ctx context.Context, c capacityOptions, offer func(rate float64, try int) stepResult) (steps []stepResult, held float64) {
	holds := func(rate float64) bool {
		for try := range 2 {
			r := offer(rate, try)
			steps = append(steps, r)
			if r.WithinSLO || ctx.Err() != nil {
				return r.WithinSLO
			}
		}
		return false
	}
	broken := 0.0
	for rate := c.Start; rate <= c.Max && ctx.Err() == nil; rate *= c.Factor {
		if !holds(rate) {
			broken = rate
			break
		}
		held = rate
	}
	if held == 0 || broken == 0 {
		return steps, held
	}
	for range c.Refine {
		if ctx.Err() != nil {
			break
		}
		if mid := math.Sqrt(held * broken); holds(mid) {
			held = mid
		} else {
			broken = mid
		}
	}
	return steps, held
}

func pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// capacitySKU is the hot SKU of the capacity run, with more stock than any
// step can sell: the run measures sales, not sold-out answers.
const capacitySKU = "lt-capacity"

// runCapacityRow measures one row: its ceiling with the ceiling tool, then
// the search, then the overload step at twice the rate held.
func runCapacityRow(ctx context.Context, log *slog.Logger, o options, env testEnv, s spec) (res capacityResult, err error) {
	res = capacityResult{Spec: s}
	re, err := startRow(ctx, log, o, env, s)
	if err != nil {
		return res, err
	}
	defer re.close()
	if err := re.adm.do(ctx, http.MethodPost, "/admin/v1/products",
		map[string]any{"sku": capacitySKU, "name": "capacity", "stock": 100_000_000, "price_cents": 1}, nil); err != nil {
		return res, err
	}
	if res.Ceiling, err = measureCeiling(ctx, o.shop, re.shop); err != nil {
		return res, err
	}
	log.Info("ceiling", "row", s.Name, "serialized_ms", fmt.Sprintf("%.2f", res.Ceiling.SerializedMicros/1000),
		"ceiling_per_s", fmt.Sprintf("%.0f", res.Ceiling.CeilingPerSec))
	b, err := newBuyer(re.urls, re.sec, o.Users, capacitySKU)
	if err != nil {
		return res, err
	}
	c := o.Probe
	res.Steps, res.Held = b.search(ctx, log, s.Name, c)
	if res.Held > 0 && ctx.Err() == nil {
		over := b.offer(ctx, 2*res.Held, c.Step, c.SLO, c.MaxErrors)
		res.Overload = &over
		log.Info("overload step", "row", s.Name, "rate", fmt.Sprintf("%.0f", over.Rate), "p99_ms", fmt.Sprintf("%.1f", over.P99),
			"turned_away", fmt.Sprintf("%.2f", float64(over.Busy)/float64(max(over.Offered, 1))))
	}
	if ctx.Err() == nil {
		flood := b.offer(ctx, max(4*res.Held, res.Ceiling.CeilingPerSec, c.Start), c.Step, c.SLO, c.MaxErrors)
		res.Flood = &flood
		log.Info("flood step", "row", s.Name, "rate", fmt.Sprintf("%.0f", flood.Rate), "sold_per_s", fmt.Sprintf("%.0f", flood.SalesPerS),
			"p99_ms", fmt.Sprintf("%.1f", flood.P99))
	}
	if s.Strategy == "optimistic" {
		res.RetriesPerSale, err = retriesPerRequest(ctx, re.urls)
		if err != nil {
			log.Warn("optimistic metrics", "row", s.Name, "err", err)
		}
	}
	return res, nil
}

// measureCeiling runs the ceiling tool (loadtest/ceiling, built beside the
// shop binary) with the row's environment: the same servers, database and
// key prefix as its instances.
func measureCeiling(ctx context.Context, shop string, env []string) (ceilingResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(filepath.Dir(shop), "ceiling"), "-n", "300")
	cmd.Env = env
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return ceilingResult{}, fmt.Errorf("ceiling: %w: %s", err, tail(stderr.Bytes()))
	}
	var c ceilingResult
	if err := json.Unmarshal(bytes.TrimSpace(lastLine(out)), &c); err != nil {
		return c, fmt.Errorf("ceiling printed %q: %w", tail(out), err)
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
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, u+"/metrics", nil)
		if err != nil {
			return 0, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
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
		resp.Body.Close()
	}
	if requests == 0 {
		return 0, nil
	}
	return (attempts - requests) / requests, nil
}

// capacityReport is the capacity run's output.
type capacityReport struct {
	Options options          `json:"options"`
	Machine machine          `json:"machine"`
	Results []capacityResult `json:"results"`
	Command string           `json:"command"`
	At      time.Time        `json:"at"`
}

func runCapacity(ctx context.Context, log *slog.Logger, o options, env testEnv, m machine) int {
	rep := capacityReport{Options: o, Machine: m, Command: command(os.Args[1:]), At: time.Now().UTC()}
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
	md := rep.markdown()
	b, _ := json.MarshalIndent(rep, "", "  ")
	for path, data := range map[string][]byte{"capacity.json": b, "capacity.md": []byte(md)} {
		if err := os.WriteFile(filepath.Join(o.out, path), data, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "runner: %v\n", err)
			return 1
		}
	}
	fmt.Print(md)
	fmt.Printf("\nreport: %s\n", filepath.Join(o.out, "capacity.md"))
	for _, r := range rep.Results {
		if r.Err != "" {
			return 1
		}
	}
	return 0
}

func (r capacityReport) markdown() string {
	var b strings.Builder
	m, o := r.Machine, r.Options
	fmt.Fprintf(&b, "# shop capacity: one hot SKU\n\n")
	fmt.Fprintf(&b, "%s, %d CPUs (%s), %s, %s. %s.\n\n", r.At.Format("2006-01-02 15:04 UTC"), m.CPUs, m.CPU, m.OS, m.Go, r.Command)
	fmt.Fprintf(&b, "%d instances per row; critical-section delay %s; lock wait budget %s. The rate offered starts at %.0f/s "+
		"and grows ×%.2f every %s (open loop) until p99 of a successful purchase passes %s or more than %.1f %% of answers "+
		"are not 201; then the gap between the last rate within both and the first past them is halved %d times (geometric "+
		"midpoints). **Held** is the highest rate within both. **Ceiling** is 1 / the serialized window of one sale, timed by one "+
		"client in a loop against the same servers in the same run (loadtest/ceiling): for a lock, acquire + the statements "+
		"inside + release; for the lock-free rows, the whole purchase. **At 2×** is a step at twice the rate held: the p99 of "+
		"the sales and the share turned away with 503. **Flooded** is a step at the ceiling (at least 4× held): the sales "+
		"per second the key still makes when offered more than it takes.\n\n",
		o.Instances, o.Delay, o.Probe.SLO*3/5, o.Probe.Start, o.Probe.Factor, o.Probe.Step, o.Probe.SLO, 100*o.Probe.MaxErrors, o.Probe.Refine)
	var atomicSQL float64
	for _, res := range r.Results {
		if res.Spec.Name == "atomic-sql" {
			atomicSQL = res.Held
		}
	}
	b.WriteString("| row | serialized ms/sale | ceiling/s | held/s | × ceiling | × atomic-sql | p99 at held | at 2×: p99 of sales | at 2×: turned away | flooded: offered → sold/s (p99) | retries/request |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, res := range r.Results {
		if res.Err != "" {
			fmt.Fprintf(&b, "| %s | did not run: %s | | | | | | | | |\n", res.Spec.Name, strings.ReplaceAll(res.Err, "|", "/"))
			continue
		}
		p99, over99, away, xs := "—", "—", "—", "—"
		for _, st := range res.Steps {
			if st.Rate == res.Held && st.WithinSLO {
				p99 = fmt.Sprintf("%.0f ms", st.P99)
			}
		}
		if ov := res.Overload; ov != nil {
			over99 = fmt.Sprintf("%.0f ms", ov.P99)
			away = fmt.Sprintf("%.0f %%", 100*float64(ov.Busy)/float64(max(ov.Offered, 1)))
		}
		if atomicSQL > 0 {
			xs = fmt.Sprintf("%.2f", res.Held/atomicSQL)
		}
		retries, flood := "", "—"
		if res.Spec.Strategy == "optimistic" {
			retries = fmt.Sprintf("%.2f", res.RetriesPerSale)
		}
		if f := res.Flood; f != nil {
			flood = fmt.Sprintf("%.0f → %.0f (%.0f ms)", f.Rate, f.SalesPerS, f.P99)
		}
		fmt.Fprintf(&b, "| %s | %.2f | %.0f | %.0f | %.2f | %s | %s | %s | %s | %s | %s |\n", res.Spec.Name,
			res.Ceiling.SerializedMicros/1000, res.Ceiling.CeilingPerSec, res.Held, res.Held/res.Ceiling.CeilingPerSec,
			xs, p99, over99, away, flood, retries)
	}
	return b.String()
}

// offered is the report's table of what each row was offered, when the
// rates came from the probe.
func (r report) offered() string {
	if r.Options.Rate != 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("## Offered rate\n\nEach row's capacity was probed first (highest rate with p99 of a sale within " +
		r.Options.Probe.SLO.String() + " and at most " + fmt.Sprintf("%.0f", 100*r.Options.Probe.MaxErrors) +
		" % errors); the seckill was offered a fixed share of it.\n\n")
	b.WriteString("| row | probed capacity /s | offered /s | stock | optimistic retries / request |\n|---|---:|---:|---:|---:|\n")
	for _, res := range r.Results {
		retries := ""
		if res.Spec.Strategy == "optimistic" {
			retries = fmt.Sprintf("%.2f", res.RetriesPerSale)
		}
		fmt.Fprintf(&b, "| %s | %.0f | %d | %d | %s |\n", res.Spec.Name, res.ProbedCapacity, res.Rate, res.Stock, retries)
	}
	b.WriteString("\n")
	return b.String()
}
