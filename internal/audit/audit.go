// Package audit holds the two admin endpoints that bracket every experiment:
// POST /admin/v1/reset lays down a named fixture, GET /admin/v1/audit counts
// how far the data drifted from the invariants since.
//
// Each domain contributes Checks and a Resetter; adding one is one line of
// wiring. The audit relies on the pairing every domain keeps: each mutable
// row (stock, balance) has insert-only records beside it (purchases, ledger
// entries) that races cannot lose, so a check can count what the mutable
// rows lost.
//
// RegisterMetrics also exports each audit's result to Prometheus, so that a
// dashboard shows the drift a load test left beside the latencies it paid.
package audit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/problem"
)

// Check is one invariant.
type Check struct {
	// Name is the member of the audit report, e.g. "oversold_units". The
	// load test reads these names: do not rename one.
	Name string
	// By names the breakdown member, e.g. "by_sku".
	By string
	// Unit is what the drift counts: "cents", "units" (of stock), "likes",
	// "points" (loyalty), "orders". It is the unit label of shop_audit_drift, so that no query
	// adds cents to units; empty is "count".
	Unit string
	// Run returns the drift of each item that drifted (zero entries may be
	// left out). It must read in one statement or one snapshot, so that a
	// write in flight is counted entirely or not at all.
	Run func(ctx context.Context) (map[string]int64, error)
}

// Resetter replaces a domain's data with a named fixture.
type Resetter interface {
	// Reset deletes the domain's rows and inserts those of fixture, one of
	// Fixtures. It never lowers a fencing token: a holder of a lock taken
	// before the reset must still be refused.
	Reset(ctx context.Context, fixture string) error
}

// Fixtures are the names POST /admin/v1/reset accepts; the first is the
// default. docs/api.md lists what each one holds.
var Fixtures = []string{"default", "loadtest"}

// Drift is one check's result.
type Drift struct {
	// Total is the sum of the absolute drifts: drifts of opposite signs do
	// not cancel out.
	Total int64
	By    map[string]int64
}

// Report is the audit's answer: OK is true when every drift is zero.
type Report struct {
	OK        bool
	CheckedAt time.Time
	Drifts    map[string]Drift
	by        map[string]string
	units     map[string]string
}

// MarshalJSON writes {"ok":…, "checked_at":…, "<check>":{"total":n,"<by>":{…}}}.
func (r Report) MarshalJSON() ([]byte, error) {
	out := map[string]any{"ok": r.OK, "checked_at": r.CheckedAt}
	for name, d := range r.Drifts {
		by := d.By
		if by == nil {
			by = map[string]int64{}
		}
		out[name] = map[string]any{"total": d.Total, r.by[name]: by}
	}
	return json.Marshal(out)
}

// ErrResetDisabled answers POST /reset on an Auditor whose reset is off.
var ErrResetDisabled = errors.New("the reset is disabled on this instance (production); set SHOP_ALLOW_RESET=true to allow it")

// Problems are the audit errors' rows of the API's problem table.
func Problems() []problem.Mapping {
	return []problem.Mapping{
		{Target: ErrResetDisabled, Status: http.StatusForbidden, Slug: "reset-disabled", Title: "Reset disabled"},
	}
}

// Auditor runs checks and resets.
type Auditor struct {
	checks        []Check
	resetters     []Resetter
	metrics       *metrics // nil until RegisterMetrics
	resetDisabled bool
	atomically    func(ctx context.Context, fn func(context.Context) error) error
}

// ResetAtomically runs every reset inside atomically, which runs fn in one
// database transaction and commits it only if fn returns nil. Domain by
// domain, a change committed between two domains' resets keeps its rows in
// one and loses them in the other: a paid order deleted, its debit kept.
func (a *Auditor) ResetAtomically(atomically func(ctx context.Context, fn func(context.Context) error) error) {
	a.atomically = atomically
}

// DisableReset makes POST /reset answer 403 and change nothing: in
// production one wrong request would otherwise wipe every balance.
func (a *Auditor) DisableReset() { a.resetDisabled = true }

// New returns an Auditor over the given checks and resetters. Resetters run
// in order; put a domain that refers to another's rows first.
func New(checks []Check, resetters []Resetter) *Auditor {
	return &Auditor{checks: checks, resetters: resetters}
}

// metrics are the last audit's result. The three are vectors, even the two
// without a label, so that nothing is exported before the first audit: a
// fresh process would otherwise report shop_audit_ok 0, "drifted", about
// data it never looked at.
type metrics struct {
	drift     *prometheus.GaugeVec
	ok        *prometheus.GaugeVec
	checkedAt *prometheus.GaugeVec
}

// RegisterMetrics registers on reg, from the next audit on:
//   - shop_audit_drift{check,unit}: the Total of each check (oversold_units,
//     balance_drift, like_drift, duplicate_orders, ...) in its Unit;
//   - shop_audit_ok: 1 when every drift was zero, else 0;
//   - shop_audit_checked_timestamp_seconds: when that audit ran.
//
// Every successful Audit (GET /admin/v1/audit) sets them; a failed one
// leaves them as they were, and the timestamp shows their age. With several
// instances only the one that answered the audit is current: select it by
// the newest timestamp. Call RegisterMetrics once, before the Auditor
// serves; it panics if reg already holds these metrics.
func (a *Auditor) RegisterMetrics(reg prometheus.Registerer) {
	m := &metrics{
		drift: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shop_audit_drift",
			Help: "Total drift each audit check found in the last audit (0: the invariant holds), in the check's unit.",
		}, []string{"check", "unit"}),
		ok: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shop_audit_ok",
			Help: "1 if the last audit found no drift at all, 0 if any check drifted.",
		}, nil),
		checkedAt: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shop_audit_checked_timestamp_seconds",
			Help: "Unix time of the last successful audit of this instance.",
		}, nil),
	}
	reg.MustRegister(m.drift, m.ok, m.checkedAt)
	a.metrics = m
}

func (m *metrics) set(r Report) {
	for name, d := range r.Drifts {
		m.drift.WithLabelValues(name, r.units[name]).Set(float64(d.Total))
	}
	ok := 0.0
	if r.OK {
		ok = 1
	}
	m.ok.WithLabelValues().Set(ok)
	m.checkedAt.WithLabelValues().Set(float64(r.CheckedAt.UnixNano()) / 1e9)
}

// Audit runs every check.
func (a *Auditor) Audit(ctx context.Context) (Report, error) {
	r := Report{OK: true, CheckedAt: time.Now().UTC(), Drifts: map[string]Drift{}, by: map[string]string{}, units: map[string]string{}}
	for _, c := range a.checks {
		by, err := c.Run(ctx)
		if err != nil {
			return Report{}, fmt.Errorf("audit %s: %w", c.Name, err)
		}
		d := Drift{By: map[string]int64{}}
		for k, v := range by {
			if v == 0 {
				continue
			}
			d.By[k] = v
			d.Total += abs(v)
		}
		if d.Total != 0 {
			r.OK = false
		}
		r.Drifts[c.Name] = d
		r.by[c.Name] = c.By
		r.units[c.Name] = c.Unit
		if c.Unit == "" {
			r.units[c.Name] = "count"
		}
	}
	if a.metrics != nil {
		a.metrics.set(r)
	}
	return r, nil
}

// Reset resets every domain to fixture.
func (a *Auditor) Reset(ctx context.Context, fixture string) error {
	resetAll := func(ctx context.Context) error {
		for _, r := range a.resetters {
			if err := r.Reset(ctx, fixture); err != nil {
				return fmt.Errorf("reset to %s: %w", fixture, err)
			}
		}
		return nil
	}
	if a.atomically == nil {
		return resetAll(ctx)
	}
	if err := a.atomically(ctx, resetAll); err != nil {
		return err
	}
	for _, r := range a.resetters {
		if c, ok := r.(CommitListener); ok {
			c.ResetCommitted(ctx, fixture)
		}
	}
	return nil
}

// CommitListener is a Resetter with a cache outside the database (the
// Redis stock mirror) to drop once the reset's transaction committed: one
// dropped before, inside the transaction, may be loaded again from the
// rows the reset is about to replace.
type CommitListener interface {
	ResetCommitted(ctx context.Context, fixture string)
}

func abs(v int64) int64 {
	if v < 0 {
		return -v
	}
	return v
}

// Register adds GET /audit and POST /reset to the admin group.
func (a *Auditor) Register(admin *gin.RouterGroup) {
	admin.GET("/audit", problem.Handle(a.getAudit))
	admin.POST("/reset", problem.Handle(a.postReset))
}

func (a *Auditor) getAudit(c *gin.Context) error {
	r, err := a.Audit(c.Request.Context())
	if err != nil {
		return err
	}
	c.JSON(http.StatusOK, r)
	return nil
}

type resetRequest struct {
	Fixture string `json:"fixture"`
}

func (a *Auditor) postReset(c *gin.Context) error {
	if a.resetDisabled {
		return ErrResetDisabled
	}
	req := resetRequest{Fixture: Fixtures[0]}
	// The body is optional: an empty one resets to the default fixture,
	// chunked or not.
	empty, err := problem.EmptyBody(c)
	if err != nil {
		return err
	}
	if !empty {
		if err := problem.DecodeJSON(c, &req); err != nil {
			return err
		}
	}
	if !slices.Contains(Fixtures, req.Fixture) {
		return problem.BadRequest(fmt.Sprintf("fixture must be one of %s, got %q",
			strings.Join(Fixtures, ", "), req.Fixture))
	}
	if err := a.Reset(c.Request.Context(), req.Fixture); err != nil {
		return err
	}
	c.JSON(http.StatusOK, gin.H{"fixture": req.Fixture})
	return nil
}
