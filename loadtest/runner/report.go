package main

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"html/template"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// machine is what the numbers were measured on: without it a table of
// milliseconds means nothing.
type machine struct {
	CPUs   int    `json:"cpus"`
	CPU    string `json:"cpu"`
	Memory string `json:"memory"`
	OS     string `json:"os"`
	Go     string `json:"go"`
	K6     string `json:"k6"`
}

func describeMachine(ctx context.Context, k6 string) machine {
	m := machine{CPUs: runtime.NumCPU(), CPU: "unknown", Memory: "unknown", OS: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.ParseFloat(f[1], 64); err == nil {
					m.Memory = fmt.Sprintf("%.1f GiB", kb/(1<<20))
				}
			}
		}
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`)
			}
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, k6, "version").Output(); err == nil {
		m.K6 = strings.TrimSpace(string(out))
	}
	return m
}

type report struct {
	Options options   `json:"options"`
	Machine machine   `json:"machine"`
	Results []result  `json:"results"`
	Command string    `json:"command"`
	At      time.Time `json:"at"`
}

func (r report) write(dir string) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "results.json"), b, 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.md"), []byte(r.markdown()), 0o644); err != nil {
		return err
	}
	var html bytes.Buffer
	if err := r.html(&html); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "report.html"), html.Bytes(), 0o644)
}

// failures are the rows that contradict their expectation.
func (r report) failures() []string {
	var out []string
	for _, res := range r.Results {
		for _, p := range res.Problems {
			out = append(out, fmt.Sprintf("%s (%s): %s", res.Spec.Name, res.Verdict, p))
		}
	}
	return out
}

// columns of the main table, in the order.
var columns = []string{"backend", "orders/s", "p50", "p95", "p99", "oversold units", "balance drift", "like drift", "duplicate orders",
	"paid+cancelled orders", "stock returned twice", "unreconciled order cents"}

func (res result) Cells() []string {
	if res.Err != "" {
		return []string{res.Spec.Name, "did not run", "", "", "", "", "", "", "", "", "", ""}
	}
	return []string{
		res.Spec.Name,
		fmt.Sprintf("%.1f", res.OrdersPerSec),
		ms(res.SoldLatency.P50), ms(res.SoldLatency.P95), ms(res.SoldLatency.P99),
		res.auditCell(checkOversold, "seckill"),
		res.auditCell(checkBalance, "balance"),
		res.auditCell(checkLikes, "likes"),
		res.auditCell(checkDuplicates, "orders"),
		res.auditCell(checkPaidAndCancelled, "orders"),
		res.auditCell(checkReturnedTwice, "orders"),
		res.auditCell(checkUnreconciled, "orders"),
	}
}

// table is the plain-text table printed at the end of a run.
func (r report) table() string {
	rows := [][]string{columns}
	for _, res := range r.Results {
		rows = append(rows, append(res.Cells(), res.Verdict))
	}
	rows[0] = append(append([]string{}, columns...), "verdict")
	width := make([]int, len(rows[0]))
	for _, row := range rows {
		for i, c := range row {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	b.WriteString("\n")
	for n, row := range rows {
		for i, c := range row {
			if i > 0 {
				b.WriteString(" | ")
			}
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
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

func (r report) settings() string {
	o := r.Options
	if o.Rate == 0 {
		return fmt.Sprintf("%d instances per row; seckill on one SKU for %s at %.0f %% of the row's capacity, probed first "+
			"(table below), with the stock half that rate sells in the phase (at most %d); then balance, likes and "+
			"orders at 1/2, 1/2 and 1/5 of that rate together for %s; critical-section delay %s",
			o.Instances, o.Duration, 100*o.Fraction, o.Stock, o.Duration, o.Delay)
	}
	return fmt.Sprintf("%d instances per row; seckill at %d purchases/s for %s on one SKU with %d units; "+
		"then balance (%d/s), likes (%d/s) and orders (%d/s) together for %s; critical-section delay %s",
		o.Instances, o.Rate, o.Duration, o.Stock, max(1, o.Rate/2), max(1, o.Rate/2), max(1, o.Rate/5), o.Duration, o.Delay)
}

func (r report) markdown() string {
	var b strings.Builder
	m := r.Machine
	fmt.Fprintf(&b, "# shop load test\n\n")
	fmt.Fprintf(&b, "Run %s on %d CPUs (%s), %s RAM, %s; %s; %s.\n\n", r.At.Format("2006-01-02 15:04 UTC"), m.CPUs, m.CPU, m.Memory, m.OS, m.Go, m.K6)
	fmt.Fprintf(&b, "Command: `%s`\n\nSettings: %s.\n\n", r.Command, r.settings())
	fmt.Fprintf(&b, "| %s |\n|%s\n", strings.Join(columns, " | "), strings.Repeat("---|", len(columns)))
	for _, res := range r.Results {
		fmt.Fprintf(&b, "| %s |\n", strings.Join(res.Cells(), " | "))
	}
	b.WriteString("\norders/s: units of the hot SKU sold per second, from the start of the sale to the last unit sold. " +
		"p50/p95/p99: how long a buyer who got a unit waited. Damage columns: totals of GET /admin/v1/audit " +
		"(— = flow not run in that row). See docs/loadtest.md.\n\n")

	b.WriteString(r.offered())
	if rows := r.costs(); len(rows) > 0 {
		b.WriteString("## Cost per sale on the hot key\n\n")
		fmt.Fprintf(&b, "A lock on one hot key serializes the sales: while buyers queue, each sale holds the lock for the "+
			"business work (%s of work, the SQL read and write) and then hands it over. Time per sale = 1000 / orders/s; "+
			"beyond the work is what the SQL inside the lock and the lock's own release and hand-over add to each sale. "+
			"A lock-free strategy serializes only its one atomic statement (%s row: a sale takes %s end to end, and sales overlap).\n\n",
			r.Options.Delay, r.reference().Name, ms(r.reference().P50))
		b.WriteString("| row | time per sale | beyond the work |\n|---|---|---|\n")
		for _, c := range rows {
			fmt.Fprintf(&b, "| %s | %s | %s |\n", c.Name, c.PerSale, c.Overhead)
		}
		b.WriteString("\n")
	}

	b.WriteString("## Verdicts\n\n| row | backend | stock strategy | expected | verdict | why |\n|---|---|---|---|---|---|\n")
	for _, res := range r.Results {
		v := res.Verdict
		if len(res.Problems) > 0 {
			v += ": " + strings.Join(res.Problems, "; ")
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", res.Spec.Name, res.Spec.Backend, res.Spec.Strategy, res.Spec.Expect, v, res.Spec.Why)
	}

	b.WriteString("\n## Details\n\n| row | sold | sold out | 503 busy | last sale | sold-out p50 / p99 | balance p50 / p99 | like p50 / p99 | order p50 / p99 | orders created / replayed | racing retry 409: lock / unique row | stock drift | fenced 503 | lock-busy 503 | failed req | dropped | thresholds crossed |\n")
	b.WriteString("|" + strings.Repeat("---|", 17) + "\n")
	for _, res := range r.Results {
		if res.Err != "" {
			fmt.Fprintf(&b, "| %s | did not run: %s ||||||||||||||||\n", res.Spec.Name, res.Err)
			continue
		}
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %s | %s / %s | %s / %s | %s / %s | %s / %s | %d / %d | %d / %d | %s | %d | %d | %.2f%% | %d | %s |\n",
			res.Spec.Name, res.Sold, res.SoldOut, res.Busy, ms(res.LastSaleMs),
			ms(res.SoldOutLat.P50), ms(res.SoldOutLat.P99),
			ms(res.Balance.P50), ms(res.Balance.P99), ms(res.Likes.P50), ms(res.Likes.P99),
			ms(res.Orders.P50), ms(res.Orders.P99),
			res.OrdersMade, res.Replays, res.InFlightLock, res.InFlightRow,
			res.auditCell("stock_drift", "seckill"), res.Fenced, res.LockBusy,
			100*res.FailedRate, res.Dropped, orNone(strings.Join(res.Crossed, "; ")))
	}
	return b.String()
}

// ref is the row whose sales nothing serializes: atomic-sql if it ran,
// else none.
type ref struct {
	Name string
	P50  float64
}

func (r report) reference() ref {
	for _, name := range []string{"atomic-sql", "atomic-redis", "none"} {
		for _, res := range r.Results {
			if res.Spec.Name == name && res.Err == "" && res.SoldLatency.P50 > 0 {
				return ref{Name: name, P50: res.SoldLatency.P50}
			}
		}
	}
	return ref{Name: "none"}
}

type cost struct {
	Name, PerSale, Overhead string
}

// costs is the lock rows' serialized time per sale. A row that sold as fast
// as buyers arrived was never saturated, so its time per sale is the
// arrival interval, and the lock's cost is hidden: it says so instead.
func (r report) costs() []cost {
	var out []cost
	for _, res := range r.Results {
		if res.Err != "" || res.OrdersPerSec == 0 || res.Spec.Strategy != "lock" || res.Spec.Backend == "none" {
			continue
		}
		per := 1000 / res.OrdersPerSec
		c := cost{Name: res.Spec.Name, PerSale: ms(per)}
		switch {
		case res.OrdersPerSec >= 0.95*float64(res.Rate) && r.Options.Rate == 0:
			c.Overhead = "hidden: offered a share of its capacity, by design (make capacity measures it)"
		case res.OrdersPerSec >= 0.95*float64(res.Rate):
			c.Overhead = "hidden: sold as fast as buyers arrived (raise -rate)"
		case res.Spec.Expect == expectDamage:
			c.Overhead = "not a lock across processes"
		default:
			c.Overhead = ms(per - float64(r.Options.Delay)/float64(time.Millisecond))
		}
		out = append(out, c)
	}
	return out
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

//go:embed report.html.tmpl
var reportTemplate string

var reportHTML = template.Must(template.New("report").Parse(reportTemplate))

func (r report) html(w *bytes.Buffer) error {
	var names []string
	var rate, p50, p95, p99, oversold, balance, likes, dups []float64
	for _, res := range r.Results {
		names = append(names, res.Spec.Name)
		if res.Err != "" {
			for _, s := range []*[]float64{&rate, &p50, &p95, &p99, &oversold, &balance, &likes, &dups} {
				*s = append(*s, nan)
			}
			continue
		}
		rate = append(rate, res.OrdersPerSec)
		p50 = append(p50, res.SoldLatency.P50)
		p95 = append(p95, res.SoldLatency.P95)
		p99 = append(p99, res.SoldLatency.P99)
		oversold = append(oversold, res.auditValue(checkOversold, "seckill"))
		balance = append(balance, res.auditValue(checkBalance, "balance"))
		likes = append(likes, res.auditValue(checkLikes, "likes"))
		dups = append(dups, res.auditValue(checkDuplicates, "orders"))
	}
	damage := []series{{"oversold units", "#c0392b", oversold}, {"balance drift (cents)", "#d35400", balance},
		{"like drift", "#8e44ad", likes}, {"duplicate orders", "#2c3e50", dups}}
	var damageCharts []template.HTML
	for _, s := range damage {
		damageCharts = append(damageCharts, hbars(s.name, "", names, []series{s}, 262))
	}
	return reportHTML.Execute(w, map[string]any{
		"R":        r,
		"Settings": r.settings(),
		"Columns":  columns,
		"Throughput": hbars("Seckill: units sold per second while stock lasted", "/s", names,
			[]series{{"orders/s", "#2874a6", rate}}, 520),
		"Latency": hbars("Seckill: latency of a successful purchase", "ms", names,
			[]series{{"p50", "#76b7b2", p50}, {"p95", "#f28e2b", p95}, {"p99", "#e15759", p99}}, 520),
		"Damage": damageCharts,
		"Costs":  r.costs(),
		"Ref":    r.reference(),
	})
}

// auditValue is an audit total for a chart; NaN when not measured.
func (res result) auditValue(name, flow string) float64 {
	v, err := strconv.ParseFloat(res.auditCell(name, flow), 64)
	if err != nil {
		return nan
	}
	return v
}
