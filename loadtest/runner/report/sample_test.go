package report

import (
	"maps"
	"time"
)

// sample is a report shaped like a full run: every kind of row, with the
// figures of a real one.
func sample() Report {
	all := []string{"seckill", "balance", "likes", "orders", "limit"}
	lock := func(name string, capacity float64, rate int, sold, p50, p99 float64) Result {
		row := Row{Name: name, Backend: name, Strategy: "lock", Flows: all, Expect: ExpectClean,
			NoFence: name == "redlock" || name == "memcached"}
		return Result{Spec: row, ProbedCapacity: capacity, Rate: rate, OrdersPerSec: sold, Stock: 300, Sold: 300,
			SoldLatency: Latency{P50: p50, P95: p99 - 1, P99: p99}, AuditOK: true, Audit: audit(nil)}
	}
	none := lock("none", 364, 254, 252.5, 13.1, 24.3)
	none.Spec.Expect, none.AuditOK, none.Audit = ExpectDamage, false, audit(map[string]int64{
		CheckOversold: 733, CheckBalance: 11063, CheckLikes: 39, CheckReturnedTwice: 302, CheckUnreconciled: 25500})
	local := lock("local", 364, 254, 64.4, 16.3, 34.4)
	local.Spec.Expect, local.AuditOK, local.Audit, local.Fenced = ExpectDamage, false, audit(map[string]int64{CheckLikes: 3}), 41
	reference := func(name string, sold float64) Result {
		r := lock(name, 364, 254, sold, 12.1, 15.7)
		r.Spec.Backend, r.Spec.Strategy, r.Spec.Flows = "none", name, []string{"seckill", "limit"}
		r.Audit = map[string]int64{CheckOversold: 0}
		return r
	}
	optimistic := lock("optimistic", 76, 53, 52.9, 13.1, 26.6)
	optimistic.Spec.Backend, optimistic.Spec.Strategy, optimistic.Spec.Flows = "none", "optimistic", []string{"seckill", "balance", "limit"}
	optimistic.RetriesPerSale = 1.31
	rep := Report{
		Options: Options{Instances: 3, Duration: 15 * time.Second, Delay: 10 * time.Millisecond, Stock: 300, Fraction: 0.7},
		Machine: Machine{CPUs: 2, CPU: "AMD EPYC 7B13", Memory: "23.5 GiB", OS: "Debian GNU/Linux 12 (bookworm)", Go: "go1.26.8", K6: "k6 v1.8.1"},
		Command: "go run ./loadtest/runner -shop bin/shop -k6 bin/k6 -instances 3 -rate 0 -fraction 0.7 -delay 10ms " +
			"-stock 300 -step 2s -max-rate 400 -record docs/results -backends all -duration 15s",
		Commit: "93ddb7d5e1c2-dirty",
		At:     time.Date(2026, 11, 23, 2, 33, 0, 0, time.UTC),
		Results: []Result{none, local,
			lock("redis", 76, 53, 53.0, 14.8, 17.4), lock("redlock", 72, 50, 50.1, 13.8, 16.4),
			lock("mysql", 65, 45, 45.0, 15.8, 19.3), lock("mysql-forupdate", 81, 56, 56.0, 14.2, 19.0),
			lock("zookeeper", 72, 50, 50.0, 15.3, 23.0), lock("etcd", 76, 53, 53.0, 15.6, 29.3),
			lock("memcached", 76, 53, 53.0, 13.3, 15.4),
			reference("atomic-sql", 252.1), reference("atomic-redis", 250.8), optimistic},
	}
	rep.Options.Probe.SLO, rep.Options.Probe.MaxErrors = 250*time.Millisecond, 0.01
	for i := range rep.Results {
		rep.Results[i].Judge()
	}
	return rep
}

// audit is a whole audit's totals: every check 0 but those in damage, and
// the stock drift that follows from the units oversold.
func audit(damage map[string]int64) map[string]int64 {
	totals := map[string]int64{CheckOversold: 0, CheckBalance: 0, CheckLikes: 0, CheckDuplicates: 0,
		CheckPaidAndCancelled: 0, CheckReturnedTwice: 0, CheckUnreconciled: 0}
	maps.Copy(totals, damage)
	totals[CheckStockDrift] = totals[CheckOversold]
	return totals
}
