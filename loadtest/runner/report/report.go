package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/lockbench/shop/loadtest/runner/capacity"
)

// Machine is what the numbers were measured on: without it a table of
// milliseconds means nothing.
type Machine struct {
	CPUs   int    `json:"cpus"`
	CPU    string `json:"cpu"`
	Memory string `json:"memory"`
	OS     string `json:"os"`
	Go     string `json:"go"`
	K6     string `json:"k6"`
}

func (m Machine) String() string {
	s := fmt.Sprintf("%d CPUs (%s), %s RAM, %s; %s", m.CPUs, m.CPU, m.Memory, m.OS, m.Go)
	if m.K6 != "" { // make capacity runs no k6
		s += "; " + m.K6
	}
	return s
}

// Options are the knobs of one run; every row of a report shares them.
type Options struct {
	Rows      []string      `json:"rows"`
	Instances int           `json:"instances"`
	Duration  time.Duration `json:"duration"`
	Rate      int           `json:"rate"`
	Delay     time.Duration `json:"delay"`
	Stock     int           `json:"stock"`
	MaxVUs    int           `json:"max_vus"`
	Users     int           `json:"users"`
	Flows     []string      `json:"flows"`

	// Fraction is the share of each row's probed capacity the load test
	// offers when Rate is 0 (the default), so that its verdict does not
	// depend on the machine's speed.
	Fraction float64 `json:"fraction,omitempty"`
	// Probe is the capacity search each row runs first when Rate is 0.
	Probe capacity.Options `json:"probe"`
}

// Report is one load-test run.
type Report struct {
	Options Options   `json:"options"`
	Machine Machine   `json:"machine"`
	Results []Result  `json:"results"`
	Command string    `json:"command"`
	Commit  string    `json:"commit,omitempty"`
	At      time.Time `json:"at"`
}

// Write writes results.json, report.md and report.html into dir.
func (r Report) Write(dir string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	var html bytes.Buffer
	if err := r.HTML(&html, faultsLink(dir)); err != nil {
		return err
	}
	for name, data := range map[string][]byte{"results.json": b, "report.md": []byte(r.Markdown()), "report.html": html.Bytes()} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// faultsLink is docs/faults.md as seen from a report in dir, which the
// runner resolves against the repository root it runs in.
func faultsLink(dir string) string {
	rel, err := filepath.Rel(dir, filepath.Join("docs", "faults.md"))
	if err != nil {
		return "docs/faults.md"
	}
	return filepath.ToSlash(rel)
}

// Failures are the rows that contradict their expectation.
func (r Report) Failures() []string {
	var out []string
	for _, res := range r.Results {
		for _, p := range res.Problems {
			out = append(out, fmt.Sprintf("%s (%s): %s", res.Spec.Name, res.Verdict, p))
		}
	}
	return out
}

// Columns of the main table: the row's cost on the hot key, then the
// audit's damage. The verdict comes after the row name in the HTML, last
// elsewhere.
var Columns = []string{"row", "capacity /s", "offered /s", "sold /s", "p50", "p99",
	"oversold units", "units over the limit", "balance drift", "like drift", "duplicate orders",
	"paid+cancelled orders", "stock returned twice", "unreconciled order cents"}

// firstDamageColumn is the index in Columns where the audit's totals start.
const firstDamageColumn = 6

// Cells are the row's cells under Columns.
func (res Result) Cells() []string {
	if res.Err != "" {
		cells := make([]string, len(Columns)) // the verdict says why
		cells[0] = res.Spec.Name
		return cells
	}
	return []string{
		res.Spec.Name,
		orDash(res.ProbedCapacity, "%.0f"),
		orDash(float64(res.Rate), "%.0f"),
		orDash(res.OrdersPerSec, "%.1f"),
		ms(res.SoldLatency.P50), ms(res.SoldLatency.P99),
		res.auditCell(CheckOversold, "seckill"),
		res.overLimitCell(),
		res.auditCell(CheckBalance, "balance"),
		res.auditCell(CheckLikes, "likes"),
		res.auditCell(CheckDuplicates, "orders"),
		res.auditCell(CheckPaidAndCancelled, "orders"),
		res.auditCell(CheckReturnedTwice, "orders"),
		res.auditCell(CheckUnreconciled, "orders"),
	}
}

func orDash(v float64, format string) string {
	if v == 0 {
		return "—"
	}
	return fmt.Sprintf(format, v)
}

// Settings says in a sentence what every row was offered.
func (r Report) Settings() string {
	events := r.eventResults()
	if len(events) == 0 {
		return r.lockSettings()
	}
	orders := max(1, events[0].Rate/5)
	s := fmt.Sprintf("events rows: %d instances, the orders flow alone at %d orders/s for %s, a broker and 2 consumers of "+
		"their own, SHOP_EVENTS_ACK_WAIT=2s, SHOP_LOCK_TTL=5s", r.Options.Instances, orders, r.Options.Duration)
	if len(events) == len(r.Results) {
		return s
	}
	return r.lockSettings() + "; " + s
}

// lockSettings is what the rows other than the events rows were offered.
func (r Report) lockSettings() string {
	o := r.Options
	if o.Rate == 0 {
		return fmt.Sprintf("%d instances per row; each row's capacity on one hot SKU probed first (the highest rate with p99 of a "+
			"sale within %s and at most %.0f %% errors), then the seckill offered %.0f %% of it for %s with the stock half that rate "+
			"sells in the phase (at most %d); then balance, likes and orders at 1/2, 1/2 and 1/5 of that rate together for %s; "+
			"critical-section delay %s",
			o.Instances, o.Probe.SLO, 100*o.Probe.MaxErrors, 100*o.Fraction, o.Duration, o.Stock, o.Duration, o.Delay)
	}
	return fmt.Sprintf("%d instances per row; seckill at %d purchases/s for %s on one SKU with %d units; "+
		"then balance (%d/s), likes (%d/s) and orders (%d/s) together for %s; critical-section delay %s",
		o.Instances, o.Rate, o.Duration, o.Stock, max(1, o.Rate/2), max(1, o.Rate/2), max(1, o.Rate/5), o.Duration, o.Delay)
}

// Table is the plain-text table printed at the end of a run.
func (r Report) Table() string {
	rows := [][]string{append(append([]string{}, Columns...), "verdict")}
	for _, res := range r.Results {
		rows = append(rows, append(res.Cells(), res.Verdict))
	}
	out := "\n" + aligned(rows)
	if events := r.eventResults(); len(events) > 0 {
		rows = [][]string{append(append([]string{}, EventColumns...), "verdict")}
		for _, res := range events {
			rows = append(rows, append(res.EventCells(), res.Verdict))
		}
		out += "\n" + aligned(rows)
	}
	return out
}

// aligned lays rows out in columns: the first and last left-aligned (names
// and verdicts), numbers right-aligned, a rule under the header.
func aligned(rows [][]string) string {
	width := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	for n, row := range rows {
		for i, c := range row {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i > 0 {
				b.WriteString(" | ")
			}
			if i == 0 || i == len(row)-1 {
				b.WriteString(c + pad)
			} else {
				b.WriteString(pad + c)
			}
		}
		b.WriteString("\n")
		if n == 0 {
			for i, w := range width {
				if i > 0 {
					b.WriteString("-+-")
				}
				b.WriteString(strings.Repeat("-", w))
			}
			b.WriteString("\n")
		}
	}
	return b.String()
}
