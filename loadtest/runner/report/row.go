// Package report is the load test's verdict and its reports: what each row
// promised, whether its run kept the promise, and the Markdown, HTML and
// terminal tables that show per row both what a lock prevents (the audit's
// damage) and what it costs (the rate the row holds on one hot key).
package report

import "slices"

// Expectation is what a row must show for the run to pass.
type Expectation string

const (
	// ExpectClean: a lock that holds across processes, or a lock-free
	// atomic strategy: every audit total must be zero.
	ExpectClean Expectation = "clean"
	// ExpectDamage: no lock (none) or one that only excludes within a
	// process (local across several instances). The audit must find
	// damage, or the fenced stores must have refused stale writes (a
	// broken lock caught by its fence, which is what local's per-process
	// tokens run into); otherwise the load was too light to show anything.
	ExpectDamage Expectation = "damage"
)

// Row is one row of a run: which backend and strategy the instances run,
// which flows k6 drives, and what the row must show.
type Row struct {
	Name     string      `json:"name"`
	Backend  string      `json:"backend"`
	Strategy string      `json:"strategy"`
	Flows    []string    `json:"flows"`
	Expect   Expectation `json:"expect"`
	Why      string      `json:"why"`
	// Combine is SHOP_STOCK_COMBINE: rows named <backend>+combined serve
	// up to this many queued purchases of the hot SKU per grant.
	Combine int `json:"combine,omitempty"`
	// NoFence marks a lock row whose backend issues no fencing token
	// (Fence() == 0): its zero damage holds only while no holder pauses
	// past its lease, which this load never does and the fault suite does.
	NoFence bool `json:"no_fence,omitempty"`
	// Delivery and Dedup are SHOP_EVENTS_DELIVERY and SHOP_EVENTS_DEDUP
	// of an events row (IsEvents); empty for the others, which run with
	// shop's defaults and no fault.
	Delivery string `json:"delivery,omitempty"`
	Dedup    string `json:"dedup,omitempty"`
}

// Runs reports whether the row drives flow.
func (r Row) Runs(flow string) bool { return slices.Contains(r.Flows, flow) }
