package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/lockbench/shop/loadtest/runner/report"
)

// k6Env is k6's environment for the row: the runner's own, without its
// SHOP_* and K6_* settings, then what the script reads.
func (r *row) k6Env(summary string, secs int) []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "SHOP_") && !strings.HasPrefix(kv, "K6_") {
			env = append(env, kv)
		}
	}
	return append(env,
		"K6_NO_USAGE_REPORT=true",
		"SHOP_URLS="+strings.Join(r.urls, ","),
		"SHOP_TOKENS="+mustAbs(r.tokens),
		"SHOP_SUMMARY="+mustAbs(summary),
		"SHOP_FLOWS="+strings.Join(r.spec.Flows, ","),
		"SHOP_RATE="+strconv.Itoa(r.o.Rate),
		"SHOP_DURATION="+strconv.Itoa(secs),
		"SHOP_STOCK="+strconv.Itoa(r.o.Stock),
		"SHOP_MAX_VUS="+strconv.Itoa(r.o.MaxVUs),
		"SHOP_BUYERS="+strconv.Itoa(r.o.Users),
		"SHOP_SKU="+hotSKU,
		"SHOP_ORDER_SKU="+orderSKU,
		"SHOP_LIMITED_SKU="+limitedSKU,
	)
}

// runK6 runs the script against the row and returns k6's exit code: 0, or
// 99 when a threshold was crossed (expected of the unsafe rows); anything
// else is an error of the run.
func (r *row) runK6(ctx context.Context, summary string) (int, error) {
	secs := int(math.Ceil(r.o.Duration.Seconds()))
	// Two phases, the gap between them, and each phase's graceful stop,
	// plus a minute: past that k6 is stuck, not slow.
	ctx, cancel := context.WithTimeout(ctx, time.Duration(2*secs+3+20+60)*time.Second)
	defer cancel()
	logFile, err := os.Create(r.logPath("k6"))
	if err != nil {
		return 0, err
	}
	defer logFile.Close()

	cmd := exec.CommandContext(ctx, r.o.k6, "run", "--quiet", "--no-color", r.o.script)
	cmd.SysProcAttr = childAttr()
	cmd.Stdout = os.Stdout
	cmd.Stderr = logFile
	cmd.WaitDelay = 10 * time.Second
	cmd.Env = r.k6Env(summary, secs)
	fmt.Printf("--- %s: k6 (%s)\n", r.spec.Name, strings.Join(r.spec.Flows, ", "))
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
