package main

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// Audit check names, as internal/*/http.go register them. The table shows
// these; every other check the audit reports still counts as damage.
const (
	checkOversold   = "oversold_units"
	checkBalance    = "balance_drift"
	checkLikes      = "like_drift"
	checkDuplicates = "duplicate_orders"
	// The order reconciliation's damage: orders both paid and cancelled,
	// stock a closer returned twice, money not matching the orders.
	checkPaidAndCancelled = "paid_and_cancelled_orders"
	checkReturnedTwice    = "stock_returned_twice"
	checkUnreconciled     = "unreconciled_order_cents"
)

// expectation is what a row must show for the run to pass.
type expectation string

const (
	// expectClean: a lock that holds across processes, or a lock-free
	// atomic strategy: every audit total must be zero.
	expectClean expectation = "clean"
	// expectDamage: no lock (none) or one that only excludes within a
	// process (local across several instances). The audit must find
	// damage, or the fenced stores must have refused stale writes (a
	// broken lock caught by its fence, which is what local's per-process
	// tokens run into); otherwise the load was too light to show anything.
	expectDamage expectation = "damage"
)

// spec is one row: which backend and strategy the instances run, and which
// flows k6 drives.
type spec struct {
	Name     string      `json:"name"`
	Backend  string      `json:"backend"`
	Strategy string      `json:"strategy"`
	Flows    []string    `json:"flows"`
	Expect   expectation `json:"expect"`
	Why      string      `json:"why"`
	// Combine is SHOP_STOCK_COMBINE: rows named <backend>+combined serve
	// up to this many queued purchases of the hot SKU per grant.
	Combine int `json:"combine,omitempty"`
}

// combinedSuffix marks a lock row whose instances combine the buyers of
// one SKU under one grant (SHOP_STOCK_COMBINE=combineBatch).
const (
	combinedSuffix = "+combined"
	combineBatch   = 32
)

var allFlows = []string{"seckill", "balance", "likes", "orders"}

// rowSpec is what the row name means. flows limits the flows every row
// runs (the reference rows run the seckill only, if at all).
func rowSpec(name string, instances int, flows []string) spec {
	s := baseSpec(name, instances)
	var keep []string
	for _, f := range s.Flows {
		if slices.Contains(flows, f) {
			keep = append(keep, f)
		}
	}
	s.Flows = keep
	return s
}

func baseSpec(name string, instances int) spec {
	if base, ok := strings.CutSuffix(name, combinedSuffix); ok {
		s := baseSpec(base, instances)
		s.Name, s.Combine = name, combineBatch
		s.Why += fmt.Sprintf("; up to %d queued buyers per grant", combineBatch)
		return s
	}
	switch name {
	case "none":
		return spec{Name: name, Backend: "none", Strategy: "lock", Flows: allFlows, Expect: expectDamage,
			Why: "no lock: read-modify-writes interleave"}
	case "local":
		if instances > 1 {
			return spec{Name: name, Backend: "local", Strategy: "lock", Flows: allFlows, Expect: expectDamage,
				Why: fmt.Sprintf("an in-process mutex excludes nothing across %d processes", instances)}
		}
		return spec{Name: name, Backend: "local", Strategy: "lock", Flows: allFlows, Expect: expectClean,
			Why: "one process: an in-process mutex is enough"}
	case "optimistic":
		// No lock: stock and balances are written over the version they
		// read. Likes and orders would run under none, so they stay out.
		return spec{Name: name, Backend: "none", Strategy: name, Flows: []string{"seckill", "balance"}, Expect: expectClean,
			Why: "versioned writes, retried; no lock"}
	case "atomic-sql", "atomic-redis":
		// Reference rows: the stock needs no lock, so only the seckill runs
		// and the lock backend is none (nothing else may be guarded by it).
		return spec{Name: name, Backend: "none", Strategy: name, Flows: []string{"seckill"}, Expect: expectClean,
			Why: "one atomic operation decides each sale; no lock"}
	}
	return spec{Name: name, Backend: name, Strategy: "lock", Flows: allFlows, Expect: expectClean,
		Why: "a lock shared by every instance"}
}

func (s spec) runs(flow string) bool { return slices.Contains(s.Flows, flow) }

// latency is a Trend's percentiles, in milliseconds.
type latency struct {
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	N   int64   `json:"count"`
}

// result is one row's measurements, audit and verdict.
type result struct {
	Spec spec `json:"spec"`

	// Rate is the seckill rate offered: -rate, or -fraction of
	// ProbedCapacity, the highest rate the probe held within the SLO.
	Rate           int     `json:"rate"`
	ProbedCapacity float64 `json:"probed_capacity,omitempty"`
	// RetriesPerSale: the optimistic row's extra attempts per request.
	RetriesPerSale float64 `json:"optimistic_retries_per_request,omitempty"`

	// Seckill, phase 1.
	OrdersPerSec float64 `json:"orders_per_sec"` // units sold / time of the last sale
	Stock        int64   `json:"stock"`          // units of the hot SKU on sale
	Sold         int64   `json:"sold"`
	SoldOut      int64   `json:"sold_out"`
	Busy         int64   `json:"busy"`
	LastSaleMs   float64 `json:"last_sale_ms"`
	SoldLatency  latency `json:"sold_latency"`
	SoldOutLat   latency `json:"sold_out_latency"`

	// Phase 2.
	Balance      latency          `json:"balance_latency"`
	Likes        latency          `json:"like_latency"`
	Orders       latency          `json:"order_latency"`
	OrdersMade   int64            `json:"orders_created"`
	Replays      int64            `json:"orders_replayed"`
	InFlight     int64            `json:"orders_in_flight"`
	InFlightLock int64            `json:"orders_409_lock"`
	InFlightRow  int64            `json:"orders_409_unique_row"`
	DupsSeen     int64            `json:"orders_duplicate_seen"`
	Fenced       int64            `json:"refused_fenced"`
	LockBusy     int64            `json:"refused_lock_busy"`
	Dropped      int64            `json:"dropped_iterations"`
	FailedRate   float64          `json:"http_req_failed_rate"`
	K6Exit       int              `json:"k6_exit"`
	Crossed      []string         `json:"thresholds_crossed"`
	AuditOK      bool             `json:"audit_ok"`
	Audit        map[string]int64 `json:"audit"` // check name -> total
	Err          string           `json:"error,omitempty"`
	Verdict      string           `json:"verdict"`
	Problems     []string         `json:"problems,omitempty"`
	SecondsTaken float64          `json:"seconds"`
}

// damage is the sum of every audit total.
func (r result) damage() int64 {
	var n int64
	for _, v := range r.Audit {
		n += v
	}
	return n
}

// safetyMetrics are the k6 thresholds that a correct service never
// crosses whatever its speed: more sales than stock, two orders for one key.
var safetyMetrics = []string{"seckill_sold", "orders_duplicate_seen"}

// judge sets Verdict and Problems from the expectation.
func (r *result) judge() {
	r.Problems = nil
	if r.Err != "" {
		r.Verdict = "did not run"
		r.Problems = append(r.Problems, r.Err)
		return
	}
	if r.K6Exit != 0 && r.K6Exit != 99 {
		r.Problems = append(r.Problems, fmt.Sprintf("k6 exited %d (99 would be thresholds; this is an error)", r.K6Exit))
	}
	if r.Audit == nil {
		r.Problems = append(r.Problems, "no audit")
	}
	if r.Spec.runs("seckill") && r.Sold == 0 {
		r.Problems = append(r.Problems, "nothing sold: the row measured nothing")
	}
	switch r.Spec.Expect {
	case expectClean:
		for _, name := range sortedKeys(r.Audit) {
			if v := r.Audit[name]; v != 0 {
				r.Problems = append(r.Problems, fmt.Sprintf("audit %s = %d, want 0", name, v))
			}
		}
		if r.Audit != nil && !r.AuditOK {
			r.Problems = append(r.Problems, "audit ok = false")
		}
		// A lock must let the sale finish, not only keep it correct: a
		// lock that is never freed (a broken release) sells one unit and
		// then times out every buyer, with zero damage. Rate x duration is
		// kept well above the stock, so every working lock sells out.
		if r.Spec.runs("seckill") && r.Stock > 0 && r.Sold < r.Stock {
			r.Problems = append(r.Problems, fmt.Sprintf("sold %d of %d units: the lock starved the sale", r.Sold, r.Stock))
		}
		// Nothing here pauses a holder past its lease (the watchdog renews
		// it), so a refused stale write means two holders overlapped: the
		// fence saved the data, but the lock is broken.
		if r.Fenced > 0 {
			r.Problems = append(r.Problems, fmt.Sprintf("%d writes refused as stale (fenced): two holders overlapped", r.Fenced))
		}
		for _, c := range r.Crossed {
			for _, m := range safetyMetrics {
				if strings.HasPrefix(c, m+" ") {
					r.Problems = append(r.Problems, "k6 threshold crossed: "+c)
				}
			}
		}
		if len(r.Problems) == 0 {
			r.Verdict = "safe: zero damage"
		} else {
			r.Verdict = "BROKEN"
		}
	case expectDamage:
		if r.Audit != nil && r.damage() == 0 && r.Fenced == 0 {
			r.Problems = append(r.Problems, "no damage found and no write fenced: raise -rate or -delay until the unsafe row races")
		}
		switch {
		case len(r.Problems) > 0:
			r.Verdict = "INCONCLUSIVE"
		case r.damage() > 0:
			r.Verdict = "unsafe (expected): damage found"
		default:
			r.Verdict = fmt.Sprintf("unsafe (expected), caught by the fences: %d stale writes refused", r.Fenced)
		}
	}
}

func sortedKeys(m map[string]int64) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// auditCell is the table cell of one audit check: "—" when the row did not
// run the flow or the service has no such check.
func (r result) auditCell(name, flow string) string {
	if !r.Spec.runs(flow) || r.Audit == nil {
		return "—"
	}
	v, ok := r.Audit[name]
	if !ok {
		return "n/a"
	}
	return fmt.Sprintf("%d", v)
}

func ms(v float64) string {
	if math.IsNaN(v) || v == 0 {
		return "—"
	}
	if v >= 100 {
		return fmt.Sprintf("%.0f ms", v)
	}
	return fmt.Sprintf("%.1f ms", v)
}
