package report

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/lockbench/shop/loadtest/runner/capacity"
)

func page(t *testing.T, rep Report) string {
	t.Helper()
	var b bytes.Buffer
	if err := rep.HTML(&b, "../../docs/faults.md"); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// A lock with no fence shows zeros under a load that never pauses a
// holder; the page must say what that zero does not prove, and where the
// fault table shows it.
func TestHTMLMarksTheUnfencedRowsAndPointsAtTheFaultTable(t *testing.T) {
	p := page(t, sample())
	for _, name := range []string{"redlock", "memcached"} {
		row := rowOf(t, p, name)
		if !strings.Contains(row, VerdictNoFence) || !strings.Contains(row, `href="../../docs/faults.md"`) {
			t.Errorf("row %s does not say it has no fence, with a link to the fault table:\n%s", name, row)
		}
	}
	if row := rowOf(t, p, "redis"); strings.Contains(row, "no fence") {
		t.Errorf("redis fences, yet its row says otherwise:\n%s", row)
	}
}

// Each row shows its cost (the capacity probed, the rate offered) beside
// its damage, and every kind of damage has a chart, the orders' included.
func TestHTMLShowsCapacityBesideDamageAndChartsTheOrderDamage(t *testing.T) {
	p := page(t, sample())
	row := rowOf(t, p, "mysql")
	if !strings.Contains(row, "<td>65</td><td>45</td><td>45.0</td>") {
		t.Errorf("mysql's row does not show capacity 65, offered 45, sold 45.0 side by side:\n%s", row)
	}
	for _, chart := range []string{"rate held (probed capacity), offered and sold", "oversold units",
		"order damage: orders both paid and cancelled, stock returned twice", "unreconciled order cents"} {
		if !strings.Contains(p, chart+`">`) {
			t.Errorf("no chart %q", chart)
		}
	}
}

// rowOf is the HTML table row whose first cell is name.
func rowOf(t *testing.T, page, name string) string {
	t.Helper()
	_, rest, ok := strings.Cut(page, "<tr class=\"")
	for ok {
		var row string
		row, rest, _ = strings.Cut(rest, "</tr>")
		if strings.Contains(row, "<td>"+name+"</td>") {
			return row
		}
		_, rest, ok = strings.Cut(rest, "<tr class=\"")
	}
	t.Fatalf("no row %s", name)
	return ""
}

// The dated record says what ran, where, and on which code.
func TestMarkdownRecordsCommandMachineAndCommit(t *testing.T) {
	md := sample().Markdown()
	for _, want := range []string{"# shop load test, 2026-11-23 02:33 UTC", "Commit: 93ddb7d5e1c2-dirty", "AMD EPYC 7B13",
		"Command: `go run ./loadtest/runner", "| memcached | 76 | 53 | 53.0 |", VerdictNoFence, "## Verdicts", "## Details"} {
		if !strings.Contains(md, want) {
			t.Errorf("report.md has no %q", want)
		}
	}
}

func TestWriteLinksTheFaultTableFromWhereThePageIs(t *testing.T) {
	dir := filepath.Join("loadtest", "results", "smoke")
	if got := faultsLink(dir); got != "../../../docs/faults.md" {
		t.Errorf("from %s: %q", dir, got)
	}
	tmp := t.TempDir()
	if err := sample().Write(tmp); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"results.json", "report.md", "report.html"} {
		if _, err := os.Stat(filepath.Join(tmp, f)); err != nil {
			t.Error(err)
		}
	}
}

func TestTableEndsEachRowWithItsVerdict(t *testing.T) {
	lines := strings.Split(strings.TrimSpace(sample().Table()), "\n")
	if len(lines) != 2+12 {
		t.Fatalf("%d lines", len(lines))
	}
	if !strings.HasPrefix(lines[0], "row ") || !strings.HasSuffix(strings.TrimSpace(lines[0]), "verdict") {
		t.Errorf("header %q", lines[0])
	}
	if !strings.Contains(lines[5], "redlock") || !strings.HasSuffix(strings.TrimSpace(lines[5]), VerdictNoFence) {
		t.Errorf("redlock line %q", lines[5])
	}
}

func TestCapacityRowsAreComparedWithTheirCeilingAndWithAtomicSQL(t *testing.T) {
	rep := CapacityReport{Options: Options{Probe: capacity.Options{SLO: 250 * time.Millisecond}}, Results: []CapacityRow{
		{Spec: Row{Name: "redis", Strategy: "lock"}, Ceiling: capacity.Ceiling{SerializedMicros: 1730, CeilingPerSec: 578}, Held: 430,
			Steps: []capacity.Step{{Rate: 430, P99: 79, WithinSLO: true}}},
		{Spec: Row{Name: "atomic-sql", Strategy: "atomic-sql"}, Ceiling: capacity.Ceiling{CeilingPerSec: 1121}, Held: 1110},
		{Spec: Row{Name: "etcd"}, Err: "etcd: no leader"},
	}}
	md := rep.Markdown()
	for _, want := range []string{"| redis | 1.73 | 578 | 430 | 0.74 | — | 0.39 | 79 ms | — | — | — | — | — | — | — | — |  | FAILS: not offered 2× and 4× |", "| etcd | did not run: etcd: no leader |", "|  | FAILS: did not run |"} {
		if !strings.Contains(md, want) {
			t.Errorf("capacity.md has no %q:\n%s", want, md)
		}
	}
}

func TestCapacityVerdictFailsARowThatCollapsesUnderItsBoundWhenFloodedOrQueuesAtTwiceItsRate(t *testing.T) {
	// Each row's rounds: sold/s at the rate held, p99 at 2×, sold/s at 4×.
	held := func(name string, rounds ...[3]float64) CapacityRow {
		row := CapacityRow{Spec: Row{Name: name}, Ceiling: capacity.Ceiling{CeilingPerSec: 500}, Held: 400,
			Steps: []capacity.Step{{Rate: 400, P99: 50, WithinSLO: true}}}
		for _, r := range rounds {
			row.Rounds = append(row.Rounds, capacity.Round{
				// A sale costs the instances 1,000 µs, a refusal 100; sending
				// one costs the runner 100.
				AtHeld: capacity.Step{Rate: 400, SalesPerS: r[0], P99: 60, Sold: 1200, ServiceCPU: 1.2},
				AtTwo: capacity.Step{Rate: 800, Offered: 2280, Sold: 1140, Busy: 1140, P99: r[1],
					ServiceCPU: 1.14 + 0.114},
				AtFour: capacity.Step{Rate: 1600, SalesPerS: r[2], P99: 140, Offered: 4800, Sold: 1140, Busy: 3600,
					ServiceCPU: 1.14 + 0.36, RunnerCPU: 0.48},
			})
		}
		return row
	}
	cheapSales := func(row CapacityRow) CapacityRow {
		for i := range row.Rounds {
			row.Rounds[i].AtHeld.ServiceCPU = 0.36 // 300 µs a sale
		}
		return row
	}
	// r0 = 50 µs: a 1,000 µs sale keeps at least 0.9 × 800/950 = 0.76,
	// a 300 µs one 0.9 × 100/250 = 0.36.
	rep := CapacityReport{Options: Options{Probe: capacity.Options{SLO: 250 * time.Millisecond}}, BareRefusalMicros: 50, Results: []CapacityRow{
		held("sheds", [3]float64{400, 120, 380}),
		// The machine slowed down during the row: the round's own step at
		// the rate held is the baseline, not the rate found before.
		held("slowed", [3]float64{400, 120, 380}, [3]float64{250, 130, 230}, [3]float64{200, 110, 190}),
		held("collapses", [3]float64{400, 120, 100}, [3]float64{390, 120, 120}, [3]float64{400, 120, 390}),
		held("queues", [3]float64{400, 6000, 390}),
		held("keeps-too-few", [3]float64{400, 120, 300}),
		cheapSales(held("cheap-sales", [3]float64{400, 120, 260})),
	}}
	md := rep.Markdown()
	for _, want := range []string{
		"| 140 ms | 0.95 | 0.76 | 1000 / 100 | 100 |  | ok |",
		"| 120 (110-130) ms | 50 % | 1600 → 230 (140 ms) | 140 ms | 0.95 (0.92-0.95) | 0.76 | 1000 / 100 | 100 |  | ok |",
		"| 0.31 (0.25-0.97) | 0.76 | 1000 / 100 | 100 |  | FAILS: flooded at 4× it sold 0.31× what it sold at its rate held, under its bound 0.76× |",
		"| 0.97 | 0.76 | 1000 / 100 | 100 |  | FAILS: p99 at 2× is 6000 ms, past the SLO 250ms |",
		"| 0.75 | 0.76 | 1000 / 100 | 100 |  | FAILS: flooded at 4× it sold 0.75× what it sold at its rate held, under its bound 0.76× |",
		"| 0.65 | 0.36 | 300 / 100 | 100 |  | ok |",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("capacity.md has no %q:\n%s", want, md)
		}
	}
	if got := rep.Failed(); !slices.Equal(got, []string{"collapses", "queues", "keeps-too-few"}) {
		t.Errorf("Failed() = %v, want collapses, queues and keeps-too-few", got)
	}
}

func TestCapacityRowShowsHowBusyItsLockKeptTheKey(t *testing.T) {
	row := CapacityRow{Spec: Row{Name: "redis", Strategy: "lock"}, Ceiling: capacity.Ceiling{SerializedMicros: 2000, CeilingPerSec: 500}, Held: 300,
		Rounds: []capacity.Round{{
			// 900 sales in 3 s held 1.8 s at the rate held; 1,000 grants of
			// 2.8 ms at 4x: the key was held for 0.93 of that step.
			AtHeld: capacity.Step{Rate: 300, Sold: 900, Seconds: 3, LockHeldS: 1.8, LockHolds: 900},
			AtFour: capacity.Step{Rate: 1200, Sold: 1000, Seconds: 3, LockHeldS: 2.8, LockHolds: 1000},
		}}}
	if got, want := row.keyBusy(), "0.60 / 0.93 (2.80 ms)"; got != want {
		t.Errorf("key busy %q, want %q", got, want)
	}
	row.Rounds[0].AtHeld.LockHolds, row.Rounds[0].AtFour.LockHolds = 0, 0
	if got := row.keyBusy(); got != "—" {
		t.Errorf("a row without lock holds shows key busy %q, want —", got)
	}
}

// make capacity runs no k6: its machine line names the tools it used and
// leaves no empty field behind.
func TestMachineWithoutK6NamesNoK6(t *testing.T) {
	m := Machine{CPUs: 2, CPU: "AMD EPYC", Memory: "23.5 GiB", OS: "Debian GNU/Linux 12 (bookworm)", Go: "go1.26.8"}
	if got, want := m.String(), "2 CPUs (AMD EPYC), 23.5 GiB RAM, Debian GNU/Linux 12 (bookworm); go1.26.8"; got != want {
		t.Errorf("machine line %q, want %q", got, want)
	}
	m.K6 = "k6 v1.8.1"
	if got := m.String(); !strings.HasSuffix(got, "; go1.26.8; k6 v1.8.1") {
		t.Errorf("machine line %q does not end with Go's and k6's versions", got)
	}
}
