package report

import (
	"fmt"
	"strings"
)

// Markdown is the report as a dated record: what ran where, the main
// table, the verdicts and the details.
func (r Report) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# shop load test, %s\n\n", r.At.Format("2006-01-02 15:04 UTC"))
	b.WriteString(r.provenance())
	b.WriteString(mdTable(append(append([]string{}, Columns...), "verdict"), r.mainRows()))
	b.WriteString("\n" + legend + "\n")
	b.WriteString(r.eventsMarkdown() + "\n")
	b.WriteString("## Verdicts\n\n")
	b.WriteString(mdTable([]string{"row", "backend", "stock strategy", "expected", "verdict", "why"}, r.verdictRows()))
	b.WriteString("\n## Details\n\n")
	b.WriteString(mdTable(detailColumns, r.detailRows()))
	return b.String()
}

// legend says what the main table's columns are.
const legend = "**capacity /s**: the highest seckill rate the row held on one hot SKU (p99 of a sale within the SLO), " +
	"probed before its run; **offered /s**: the share of it k6 then offered; **sold /s**: units sold per second from the " +
	"start of the sale to the last unit, which below capacity is the rate offered, not a cost. **p50/p99**: how long a " +
	"buyer who got a unit waited. Damage columns: totals of `GET /admin/v1/audit` (— = flow not run in that row). " +
	"A row marked \"no fence\" shows zeros only because nothing here pauses a holder past its lease: the fault suite " +
	"does, and shows its lost update (docs/faults.md)."

func (r Report) provenance() string {
	commit := r.Commit
	if commit == "" {
		commit = "not recorded"
	}
	return fmt.Sprintf("Machine: %s.\n\nCommand: `%s`\n\nCommit: %s\n\nSettings: %s.\n\n", r.Machine, r.Command, commit, r.Settings())
}

func (r Report) mainRows() [][]string {
	var rows [][]string
	for _, res := range r.Results {
		rows = append(rows, append(res.Cells(), res.Verdict))
	}
	return rows
}

func (r Report) verdictRows() [][]string {
	var rows [][]string
	for _, res := range r.Results {
		v := res.Verdict
		if len(res.Problems) > 0 {
			v += ": " + strings.Join(res.Problems, "; ")
		}
		rows = append(rows, []string{res.Spec.Name, res.Spec.Backend, res.Spec.Strategy, string(res.Spec.Expect), v, res.Spec.Why})
	}
	return rows
}

var detailColumns = []string{"row", "stock", "sold", "sold out", "503 busy", "last sale", "sale p95", "sold-out p50 / p99",
	"balance p50 / p99", "like p50 / p99", "order p50 / p99", "orders created / replayed",
	"racing retry 409: lock / unique row", "stock drift", "fenced 503", "lock-busy 503", "failed req", "dropped",
	"optimistic retries / request", "thresholds crossed"}

func (r Report) detailRows() [][]string {
	var rows [][]string
	for _, res := range r.Results {
		if res.Err != "" {
			row := make([]string, len(detailColumns))
			row[0], row[1] = res.Spec.Name, "did not run: "+res.Err
			rows = append(rows, row)
			continue
		}
		rows = append(rows, res.details())
	}
	return rows
}

func (res Result) details() []string {
	pair := func(l Latency) string { return ms(l.P50) + " / " + ms(l.P99) }
	retries := ""
	if res.Spec.Strategy == "optimistic" {
		retries = fmt.Sprintf("%.2f", res.RetriesPerSale)
	}
	return []string{res.Spec.Name, fmt.Sprint(res.Stock), fmt.Sprint(res.Sold), fmt.Sprint(res.SoldOut), fmt.Sprint(res.Busy),
		ms(res.LastSaleMs), ms(res.SoldLatency.P95), pair(res.SoldOutLat), pair(res.Balance), pair(res.Likes), pair(res.Orders),
		fmt.Sprintf("%d / %d", res.OrdersMade, res.Replays), fmt.Sprintf("%d / %d", res.InFlightLock, res.InFlightRow),
		res.auditCell(CheckStockDrift, "seckill"), fmt.Sprint(res.Fenced), fmt.Sprint(res.LockBusy),
		fmt.Sprintf("%.2f%%", 100*res.FailedRate), fmt.Sprint(res.Dropped), retries, orNone(strings.Join(res.Crossed, "; "))}
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// mdTable is a Markdown table; a | inside a cell would end it, so it is
// replaced.
func mdTable(header []string, rows [][]string) string {
	var b strings.Builder
	line := func(cells []string) {
		for i := range cells {
			cells[i] = strings.ReplaceAll(cells[i], "|", "/")
		}
		b.WriteString("| " + strings.Join(cells, " | ") + " |\n")
	}
	line(append([]string{}, header...))
	b.WriteString("|" + strings.Repeat("---|", len(header)) + "\n")
	for _, row := range rows {
		line(row)
	}
	return b.String()
}
