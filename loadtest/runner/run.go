package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// SKUs the runner puts on sale after the reset. The hot one has the stock
// of -stock; the order SKU has more than any run can sell, so that orders
// race on their idempotency keys, not on stock.
const (
	hotSKU   = "lt-hot"
	orderSKU = "lt-order"
	// limitedSKU is the loadtest fixture's SKU with a per-user limit; k6
	// reads the limit and stock from the service.
	limitedSKU = "lt-limited"
)

// rowEnv is one row's running world: its database, its instances, the
// admin client and the users' tokens. close stops and drops it all.
type rowEnv struct {
	urls   []string
	adm    admin
	sec    secrets
	tokens string // file of the users' tokens, for k6
	shop   []string
	// instances serve the API; events is an events row's broker and
	// consumers (nil for the other rows). A restart replaces an entry.
	instances []*instance
	events    *eventRig
	dsn       string // an events row's database, which it is measured in
	cleanups  []func()
}

// pids are the instances' process ids.
func (re *rowEnv) pids() []int {
	pids := make([]int, len(re.instances))
	for i, in := range re.instances {
		pids[i] = in.cmd.Process.Pid
	}
	return pids
}

// close undoes what the row set up, last first.
func (re *rowEnv) close() {
	for i := len(re.cleanups) - 1; i >= 0; i-- {
		re.cleanups[i]()
	}
}

// startRow creates the row's database, migrates it, starts the instances
// and lays down the fixture. The caller defers close.
func startRow(ctx context.Context, log *slog.Logger, o options, env testEnv, s report.Row) (re *rowEnv, err error) {
	re = &rowEnv{sec: newSecrets()}
	defer func() {
		if err != nil {
			re.close()
		}
	}()
	runID := strconv.Itoa(os.Getpid())
	dsn, err := re.database(ctx, log, o, env, dbName(runID, s.Name))
	if err != nil {
		return re, err
	}
	// A prefix of its own per run and row: lock keys and fence counters of
	// another run (or another engineer's tests) never meet this one's.
	instanceEnv := func(port int) []string {
		return shopEnv(o, env, s, re.sec, dsn, "lt"+runID+"-"+s.Name+":", "127.0.0.1:"+strconv.Itoa(port))
	}
	if s.IsEvents() {
		re.dsn = dsn
		if err := re.startEvents(ctx, o, env, s.Name); err != nil {
			return re, err
		}
		shared := instanceEnv
		instanceEnv = func(port int) []string { return append(shared(port), eventsEnv(s, re.events.broker.url())...) }
	}
	if err := re.startInstances(ctx, o, s.Name, instanceEnv); err != nil {
		return re, err
	}
	re.adm = admin{url: re.urls[0], token: re.sec.admin}
	if err := setUp(ctx, re.adm, o); err != nil {
		return re, err
	}
	if s.IsEvents() {
		if err := re.startConsumers(ctx, o, s.Name, instanceEnv); err != nil {
			return re, err
		}
	}
	re.tokens = filepath.Join(o.out, "tokens-"+s.Name+".json")
	re.cleanups = append(re.cleanups, func() { os.Remove(re.tokens) })
	return re, writeTokens(re.tokens, re.sec, o.Users)
}

// database creates the row's database, dropped again at close unless
// -keep.
func (re *rowEnv) database(ctx context.Context, log *slog.Logger, o options, env testEnv, name string) (string, error) {
	dsn, drop, err := env.database(ctx, name)
	if err != nil || o.keep {
		return dsn, err
	}
	re.cleanups = append(re.cleanups, func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := drop(dctx); err != nil {
			log.Warn("drop database", "database", name, "err", err)
		}
	})
	return dsn, nil
}

// startInstances migrates the database, then starts the row's instances
// and waits until every one is ready; envAt is an instance's environment
// when it listens on port.
func (re *rowEnv) startInstances(ctx context.Context, o options, row string, envAt func(port int) []string) error {
	port0, err := freePort()
	if err != nil {
		return err
	}
	re.shop = envAt(port0)
	if err := migrate(ctx, o.shop, re.shop, logPath(o.out, row, "migrate")); err != nil {
		return err
	}
	re.cleanups = append(re.cleanups, func() { stopAll(re.instances) })
	for i := range o.Instances {
		port, err := freePort()
		if err != nil {
			return err
		}
		in, err := startInstance(o.shop, envAt(port), port, logPath(o.out, row, "shop"+strconv.Itoa(i+1)))
		if err != nil {
			return err
		}
		re.instances = append(re.instances, in)
	}
	for _, in := range re.instances {
		if err := in.waitReady(ctx, 60*time.Second); err != nil {
			return err
		}
		re.urls = append(re.urls, in.url)
	}
	return nil
}

// runRow runs one row from fresh database to stopped instances.
func runRow(ctx context.Context, log *slog.Logger, o options, env testEnv, s report.Row) (res report.Result, err error) {
	started := time.Now()
	res = report.Result{Spec: s, Stock: int64(o.Stock)}
	re, err := startRow(ctx, log, o, env, s)
	if err != nil {
		return res, err
	}
	defer re.close()
	if o, err = offerFraction(ctx, log, o, s, re, &res); err != nil {
		return res, err
	}

	summaryPath := filepath.Join(o.out, s.Name+".k6.json")
	_ = os.Remove(summaryPath)
	if err := re.runTraffic(ctx, log, o, s, summaryPath, &res); err != nil {
		return res, err
	}
	if err := readSummary(summaryPath, &res); err != nil {
		return res, err
	}
	res.AuditOK, res.Audit, err = re.adm.audit(ctx, filepath.Join(o.out, s.Name+".audit.json"))
	if err != nil {
		return res, err
	}
	res.SecondsTaken = time.Since(started).Seconds()
	if s.Strategy == "optimistic" {
		if res.RetriesPerSale, err = retriesPerRequest(ctx, re.urls); err != nil {
			log.Warn("optimistic metrics", "row", s.Name, "err", err)
		}
	}
	log.Info("row done", "row", s.Name, "sold", res.Sold, "orders_per_sec", fmt.Sprintf("%.1f", res.OrdersPerSec),
		"audit_ok", res.AuditOK, "damage", res.Damage(), "k6_exit", res.K6Exit)
	return res, nil
}

// runTraffic runs k6; for an events row it makes the faults meanwhile,
// then lets the events drain and measures them.
func (re *rowEnv) runTraffic(ctx context.Context, log *slog.Logger, o options, s report.Row, summaryPath string, res *report.Result) (err error) {
	if !s.IsEvents() {
		res.K6Exit, err = runK6(ctx, o, s, re.urls, re.tokens, summaryPath)
		return err
	}
	var faults []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		faults = re.faults(ctx, log, s, o.Duration)
	}()
	res.K6Exit, err = runK6(ctx, o, s, re.urls, re.tokens, summaryPath)
	<-done
	if err != nil {
		return err
	}
	res.Events, err = re.settleEvents(ctx, s, faults)
	return err
}

// offerFraction sets the row's rate and stock when -rate is 0: it probes
// the row's capacity (the capacity search, on a SKU of its own, with the
// row's settings) and offers -fraction of it, so that every row runs below
// its own saturation on any machine. The stock is cut to what half the
// phase sells at that rate, so that a working lock always sells out.
func offerFraction(ctx context.Context, log *slog.Logger, o options, s report.Row, re *rowEnv, res *report.Result) (options, error) {
	if s.IsEvents() && o.Rate == 0 {
		// The orders flow alone: no hot SKU to probe.
		o.Rate = eventsRate
	}
	res.Rate = o.Rate
	if o.Rate > 0 {
		return o, nil
	}
	if err := re.adm.do(ctx, http.MethodPost, "/admin/v1/products",
		map[string]any{"sku": capacitySKU, "name": "capacity probe", "stock": 100_000_000, "price_cents": 1}, nil); err != nil {
		return o, err
	}
	b, err := newBuyer(re, o.Users, capacitySKU)
	if err != nil {
		return o, err
	}
	probe := o.Probe
	if s.Expect == report.ExpectDamage {
		// An unsafe row's errors are its point (local's fences refuse the
		// other processes' writes): only the latency bounds its rate.
		probe.MaxErrors = 1
	}
	_, held := search(ctx, log, re.offerer(ctx, b, probe), s.Name, probe)
	if held == 0 {
		return o, fmt.Errorf("capacity probe: not even %.0f purchases/s within the %s SLO", o.Probe.Start, o.Probe.SLO)
	}
	res.ProbedCapacity = held
	o.Rate = max(1, int(o.Fraction*held))
	o.Stock = max(1, min(o.Stock, int(float64(o.Rate)*o.Duration.Seconds()/2)))
	res.Rate, res.Stock = o.Rate, int64(o.Stock)
	log.Info("offering a fraction of the probed capacity", "row", s.Name, "capacity", fmt.Sprintf("%.0f", held), "rate", o.Rate, "stock", o.Stock)
	return o, re.adm.do(ctx, http.MethodPost, "/admin/v1/products",
		map[string]any{"sku": hotSKU, "name": "Load test hot item", "stock": o.Stock, "price_cents": 1_000}, nil)
}

func stopAll(instances []*instance) {
	var wg sync.WaitGroup
	for _, in := range instances {
		wg.Add(1)
		go func() {
			defer wg.Done()
			in.stop(10 * time.Second)
		}()
	}
	wg.Wait()
}

// setUp lays down the loadtest fixture and the run's two SKUs.
func setUp(ctx context.Context, adm admin, o options) error {
	if err := adm.do(ctx, http.MethodPost, "/admin/v1/reset", map[string]string{"fixture": "loadtest"}, nil); err != nil {
		return err
	}
	for _, p := range []map[string]any{
		{"sku": hotSKU, "name": "Load test hot item", "stock": o.Stock, "price_cents": 1_000},
		{"sku": orderSKU, "name": "Load test order item", "stock": 10_000_000, "price_cents": 100},
	} {
		if err := adm.do(ctx, http.MethodPost, "/admin/v1/products", p, nil); err != nil {
			return err
		}
	}
	return nil
}

// writeTokens mints a token for users 1..n with the run's secret, through
// the same code that verifies them in shop (k6 cannot sign HS256 without a
// remote jslib). The file is readable by its owner only and removed after
// the row; the secret dies with the run anyway.
func writeTokens(path string, sec secrets, n int) error {
	a := auth.New([]byte(sec.jwt), sec.admin)
	type entry struct {
		User  int64  `json:"user"`
		Token string `json:"token"`
	}
	list := make([]entry, n)
	now := time.Now()
	for i := range list {
		tok, err := a.Token(int64(i+1), 2*time.Hour, now)
		if err != nil {
			return err
		}
		list[i] = entry{User: int64(i + 1), Token: tok}
	}
	b, err := json.Marshal(list)
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o600)
}

// k6Env is k6's environment: the runner's own, without its SHOP_* and
// K6_* settings, then what the script reads.
func k6Env(o options, s report.Row, urls []string, tokens, summary string, secs int) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHOP_") && !strings.HasPrefix(kv, "K6_") {
			env = append(env, kv)
		}
	}
	return append(env,
		"K6_NO_USAGE_REPORT=true",
		"SHOP_URLS="+strings.Join(urls, ","),
		"SHOP_TOKENS="+mustAbs(tokens),
		"SHOP_SUMMARY="+mustAbs(summary),
		"SHOP_FLOWS="+strings.Join(s.Flows, ","),
		"SHOP_RATE="+strconv.Itoa(o.Rate),
		"SHOP_DURATION="+strconv.Itoa(secs),
		"SHOP_STOCK="+strconv.Itoa(o.Stock),
		"SHOP_MAX_VUS="+strconv.Itoa(o.MaxVUs),
		"SHOP_BUYERS="+strconv.Itoa(o.Users),
		"SHOP_SKU="+hotSKU,
		"SHOP_ORDER_SKU="+orderSKU,
		"SHOP_LIMITED_SKU="+limitedSKU,
	)
}

// runK6 runs the script and returns k6's exit code: 0, or 99 when a
// threshold was crossed (expected of the unsafe rows); anything else is an
// error of the run.
func runK6(ctx context.Context, o options, s report.Row, urls []string, tokens, summary string) (int, error) {
	secs := int(math.Ceil(o.Duration.Seconds()))
	// Two phases, the gap between them, and each phase's graceful stop,
	// plus a minute: past that k6 is stuck, not slow.
	ctx, cancel := context.WithTimeout(ctx, time.Duration(2*secs+3+20+60)*time.Second)
	defer cancel()
	logFile, err := os.Create(logPath(o.out, s.Name, "k6"))
	if err != nil {
		return 0, err
	}
	defer logFile.Close()

	cmd := exec.CommandContext(ctx, o.k6, "run", "--quiet", "--no-color", o.script)
	cmd.SysProcAttr = childAttr()
	cmd.Stdout = os.Stdout
	cmd.Stderr = logFile
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = k6Env(o, s, urls, tokens, summary, secs)
	fmt.Printf("--- %s: k6 (%s)\n", s.Name, strings.Join(s.Flows, ", "))
	err = cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return 0, nil
	case ctx.Err() != nil:
		return -1, fmt.Errorf("k6 did not finish in time: %w", ctx.Err())
	case errors.As(err, &exit) && exit.ExitCode() == 99:
		return 99, nil
	case errors.As(err, &exit):
		return exit.ExitCode(), fmt.Errorf("k6 exited %d; see %s", exit.ExitCode(), logFile.Name())
	}
	return -1, err
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

// k6Summary is the part of k6's handleSummary data the report reads.
type k6Summary struct {
	Metrics map[string]struct {
		Values     map[string]float64 `json:"values"`
		Thresholds map[string]struct {
			OK bool `json:"ok"`
		} `json:"thresholds"`
	} `json:"metrics"`
}

func readSummary(path string, r *report.Result) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("k6 summary: %w", err)
	}
	var s k6Summary
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("k6 summary %s: %w", path, err)
	}
	val := func(metric, stat string) float64 { return s.Metrics[metric].Values[stat] }
	trend := func(metric string) report.Latency {
		return report.Latency{P50: val(metric, "p(50)"), P95: val(metric, "p(95)"), P99: val(metric, "p(99)"),
			Max: val(metric, "max"), N: int64(val(metric, "count"))}
	}
	r.Sold = int64(val("seckill_sold", "count"))
	r.SoldOut = int64(val("seckill_sold_out", "count"))
	r.Busy = int64(val("seckill_busy", "count"))
	r.LastSaleMs = val("seckill_sold_at", "max")
	if r.LastSaleMs > 0 {
		r.OrdersPerSec = float64(r.Sold) / (r.LastSaleMs / 1000)
	}
	r.SoldLatency = trend("seckill_sold_latency")
	r.SoldOutLat = trend("seckill_sold_out_latency")
	r.Balance = trend("balance_latency")
	r.Likes = trend("like_latency")
	r.Orders = trend("orders_latency")
	r.OrdersMade = int64(val("orders_created", "count"))
	r.Replays = int64(val("orders_replayed", "count"))
	r.InFlight = int64(val("orders_in_flight", "count"))
	r.InFlightLock = int64(val("orders_409_lock", "count"))
	r.InFlightRow = int64(val("orders_409_unique_row", "count"))
	r.DupsSeen = int64(val("orders_duplicate_seen", "count"))
	r.LimitSold = int64(val("limit_sold", "count"))
	r.OverLimit = int64(val("limit_over_limit", "count"))
	r.Fenced = int64(val("refused_fenced", "count"))
	r.LockBusy = int64(val("refused_lock_busy", "count"))
	r.Dropped = int64(val("dropped_iterations", "count"))
	r.FailedRate = val("http_req_failed", "rate")
	r.Crossed = nil
	for name, m := range s.Metrics {
		for expr, t := range m.Thresholds {
			if !t.OK {
				r.Crossed = append(r.Crossed, name+" "+expr)
			}
		}
	}
	sort.Strings(r.Crossed)
	return nil
}
