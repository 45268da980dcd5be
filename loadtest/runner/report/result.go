package report

import (
	"fmt"
	"math"
	"strconv"
)

// Audit check names, as internal/*/http.go register them. The tables show
// these; every other check the audit reports still counts as damage.
const (
	CheckOversold   = "oversold_units"
	CheckBalance    = "balance_drift"
	CheckLikes      = "like_drift"
	CheckDuplicates = "duplicate_orders"
	// The order reconciliation's damage: orders both paid and cancelled,
	// stock a closer returned twice, money not matching the orders.
	CheckPaidAndCancelled = "paid_and_cancelled_orders"
	CheckReturnedTwice    = "stock_returned_twice"
	CheckUnreconciled     = "unreconciled_order_cents"
	CheckStockDrift       = "stock_drift"
)

// Latency is a k6 Trend's percentiles, in milliseconds.
type Latency struct {
	P50 float64 `json:"p50_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
	Max float64 `json:"max_ms"`
	N   int64   `json:"count"`
}

// Result is one row's measurements, audit and verdict.
type Result struct {
	Spec Row `json:"spec"`

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
	SoldLatency  Latency `json:"sold_latency"`
	SoldOutLat   Latency `json:"sold_out_latency"`

	// Phase 2.
	Balance      Latency `json:"balance_latency"`
	Likes        Latency `json:"like_latency"`
	Orders       Latency `json:"order_latency"`
	OrdersMade   int64   `json:"orders_created"`
	Replays      int64   `json:"orders_replayed"`
	InFlight     int64   `json:"orders_in_flight"`
	InFlightLock int64   `json:"orders_409_lock"`
	InFlightRow  int64   `json:"orders_409_unique_row"`
	DupsSeen     int64   `json:"orders_duplicate_seen"`
	// LimitSold and OverLimit: units of the limited SKU sold, and sold to
	// a user past its per-user limit, counted by the clients.
	LimitSold  int64            `json:"limit_sold"`
	OverLimit  int64            `json:"over_limit_units"`
	Fenced     int64            `json:"refused_fenced"`
	LockBusy   int64            `json:"refused_lock_busy"`
	Dropped    int64            `json:"dropped_iterations"`
	FailedRate float64          `json:"http_req_failed_rate"`
	K6Exit     int              `json:"k6_exit"`
	Crossed    []string         `json:"thresholds_crossed"`
	AuditOK    bool             `json:"audit_ok"`
	Audit      map[string]int64 `json:"audit"` // check name -> total
	// Events: an events row's events, effects and faults.
	Events       *Events  `json:"events,omitempty"`
	Err          string   `json:"error,omitempty"`
	Verdict      string   `json:"verdict"`
	Problems     []string `json:"problems,omitempty"`
	SecondsTaken float64  `json:"seconds"`
}

// Damage is the sum of every audit total, and of the events lost and
// effects doubled.
func (r Result) Damage() int64 {
	n := r.eventsDamage()
	for _, v := range r.Audit {
		n += v
	}
	return n
}

// auditCell is the table cell of one audit check: "—" when the row did not
// run the flow, "n/a" when the service has no such check.
func (r Result) auditCell(name, flow string) string {
	if !r.Spec.Runs(flow) || r.Audit == nil {
		return "—"
	}
	v, ok := r.Audit[name]
	if !ok {
		return "n/a"
	}
	return strconv.FormatInt(v, 10)
}

// overLimitCell is the table cell of the units sold past the per-user
// limit: "—" when the row did not run the limit flow.
func (r Result) overLimitCell() string {
	if !r.Spec.Runs("limit") {
		return "—"
	}
	return strconv.FormatInt(r.OverLimit, 10)
}

// auditValue is an audit total for a chart; NaN when not measured.
func (r Result) auditValue(name, flow string) float64 {
	v, err := strconv.ParseFloat(r.auditCell(name, flow), 64)
	if err != nil {
		return math.NaN()
	}
	return v
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
