package report

import (
	"bytes"
	_ "embed"
	"html/template"
	"math"
	"strings"
)

//go:embed report.html.tmpl
var reportTemplate string

var reportHTML = template.Must(template.New("report").Parse(reportTemplate))

// htmlRow is one row of the HTML table: the verdict sits beside the name,
// so that it is on screen whatever the width of the numbers.
type htmlRow struct {
	Name, Class, Verdict string
	// Problems say why a row failed, under its verdict.
	Problems     string
	NoFence      bool
	Cost, Damage []string
	// Lag: an events row's commit-to-effect latency, after its damage.
	Lag []string
}

func (r Report) htmlRows() []htmlRow {
	var rows []htmlRow
	for _, res := range r.Results {
		cells := res.Cells()
		rows = append(rows, newHTMLRow(res, cells[1:firstDamageColumn], cells[firstDamageColumn:]))
	}
	return rows
}

// eventRows are the events table's rows: the counts, the damage (lost,
// doubled), then the lag.
func (r Report) eventRows() []htmlRow {
	var rows []htmlRow
	for _, res := range r.eventResults() {
		cells := res.EventCells()
		row := newHTMLRow(res, cells[1:firstEventDamageColumn], cells[firstEventDamageColumn:firstEventDamageColumn+2])
		row.Lag = cells[firstEventDamageColumn+2:]
		rows = append(rows, row)
	}
	return rows
}

// newHTMLRow colours a row by its verdict.
func newHTMLRow(res Result, cost, damage []string) htmlRow {
	row := htmlRow{Name: res.Spec.Name, Verdict: res.Verdict, Problems: strings.Join(res.Problems, "; "),
		NoFence: res.Spec.NoFence && len(res.Problems) == 0, Cost: cost, Damage: damage}
	switch {
	case len(res.Problems) > 0:
		row.Class = "bad"
	case res.Spec.Expect == ExpectDamage:
		row.Class = "damage"
	case row.NoFence:
		row.Class = "nofence"
	default:
		row.Class = "clean"
	}
	return row
}

// HTML writes the self-contained page: the table, then charts of the cost
// (capacity, offered, sold; latency) and of every kind of damage. faults
// is the link to docs/faults.md from where the page is written.
func (r Report) HTML(w *bytes.Buffer, faults string) error {
	names := make([]string, len(r.Results))
	for i, res := range r.Results {
		names[i] = res.Spec.Name
	}
	cost := []series{
		{"capacity (probed)", "#1f4e79", r.column(func(res Result) float64 { return res.ProbedCapacity })},
		{"offered", "#7fa7cf", r.column(func(res Result) float64 { return float64(res.Rate) })},
		{"sold", "#2e8b57", r.column(func(res Result) float64 { return res.OrdersPerSec })},
	}
	latency := []series{
		{"p50", "#76b7b2", r.column(func(res Result) float64 { return res.SoldLatency.P50 })},
		{"p95", "#f28e2b", r.column(func(res Result) float64 { return res.SoldLatency.P95 })},
		{"p99", "#e15759", r.column(func(res Result) float64 { return res.SoldLatency.P99 })},
	}
	return reportHTML.Execute(w, map[string]any{
		"R":       r,
		"Rows":    r.htmlRows(),
		"Cost":    Columns[1:firstDamageColumn],
		"Damaged": Columns[firstDamageColumn:],
		"Faults":  faults,
		// nil without events rows: the template leaves the table out.
		"Events":       r.eventRows(),
		"EventColumns": EventColumns[1:],
		"CostChart": hbars("Seckill on one hot SKU: rate held (probed capacity), offered and sold", "/s",
			names, cost, 560),
		"LatencyChart": hbars("Seckill: latency of a successful purchase", "ms", names, latency, 560),
		"DamageCharts": r.damageCharts(names),
	})
}

// damageCharts are one small chart per kind of damage, the order
// reconciliation's counts grouped in one.
func (r Report) damageCharts(names []string) []template.HTML {
	audit := func(check, flow string) []float64 {
		return r.column(func(res Result) float64 { return res.auditValue(check, flow) })
	}
	one := func(title, color string, values []float64) template.HTML {
		return hbars(title, "", names, []series{{title, color, values}}, 270)
	}
	return []template.HTML{
		one("oversold units", "#c0392b", audit(CheckOversold, "seckill")),
		one("balance drift (cents)", "#d35400", audit(CheckBalance, "balance")),
		one("like drift", "#8e44ad", audit(CheckLikes, "likes")),
		one("duplicate orders", "#2c3e50", audit(CheckDuplicates, "orders")),
		hbars("order damage: orders both paid and cancelled, stock returned twice", "", names, []series{
			{"paid+cancelled", "#6c3483", audit(CheckPaidAndCancelled, "orders")},
			{"returned twice", "#b9770e", audit(CheckReturnedTwice, "orders")},
		}, 560),
		one("unreconciled order cents", "#7b241c", audit(CheckUnreconciled, "orders")),
	}
}

// column is one value per row for a chart; NaN for a row that did not run.
func (r Report) column(f func(Result) float64) []float64 {
	out := make([]float64, len(r.Results))
	for i, res := range r.Results {
		out[i] = math.NaN()
		if res.Err == "" {
			out[i] = f(res)
		}
	}
	return out
}
