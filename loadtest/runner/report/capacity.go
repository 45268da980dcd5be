package report

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/lockbench/shop/loadtest/runner/capacity"
)

// CapacityRow is one row of the capacity run: its ceiling, every step of
// the search and the rate held, then a step at twice that rate and a
// flooded one.
type CapacityRow struct {
	Spec    Row              `json:"spec"`
	Ceiling capacity.Ceiling `json:"ceiling"`
	Steps   []capacity.Step  `json:"steps"`
	// Held is the highest rate whose step stayed within the SLO and the
	// error budget; Rounds offer it again, twice and four times it.
	Held   float64          `json:"held_rate"`
	Rounds []capacity.Round `json:"rounds,omitempty"`
	// Flood is a step at the row's ceiling when that is more than 4x
	// held: how many sales per second the key still makes when offered
	// more than it can take, the rest turned away.
	Flood *capacity.Step `json:"flood,omitempty"`
	// RetriesPerSale is the optimistic strategy's extra attempts per
	// request that ended (0 for the others).
	RetriesPerSale float64 `json:"retries_per_sale,omitempty"`
	Err            string  `json:"error,omitempty"`
}

// CapacityReport is the capacity run's output.
type CapacityReport struct {
	Options Options       `json:"options"`
	Machine Machine       `json:"machine"`
	Results []CapacityRow `json:"results"`
	// BareRefusalMicros is r0, the CPU µs a bare net/http server spends
	// answering one request 503, measured in the same run: every row's
	// goodput at 4× is judged against capacity.GoodputBound with it.
	BareRefusalMicros float64 `json:"bare_refusal_cpu_us"`
	// Load is the machine's load average (1, 5, 15 min) when the run
	// started and when it ended: on shared cores, what the figures were
	// measured beside.
	Load    [2]string `json:"load_average"`
	Command string    `json:"command"`
	Commit  string    `json:"commit,omitempty"`
	At      time.Time `json:"at"`
}

var capacityColumns = []string{"row", "serialized ms/sale", "ceiling/s", "held/s", "× ceiling",
	"key busy: at held / at 4× (ms held per grant at 4×)", "× atomic-sql", "p99 at held",
	"at 2×: p99 of sales", "at 2×: turned away", "flooded: offered → sold/s (p99)", "at 4×: p99 of sales", "at 4×: sold ÷ sold at held",
	"at 4×: least kept, 0.9·(s−4·r0)/(s−r0)", "service CPU µs: per sale / per refusal", "runner CPU µs per request", "retries/request", "verdict"}

// Markdown is the capacity report as a dated record.
func (r CapacityReport) Markdown() string {
	var b strings.Builder
	fmt.Fprintf(&b, "# shop capacity: one hot SKU, %s\n\n", r.At.Format("2006-01-02 15:04 UTC"))
	commit := r.Commit
	if commit == "" {
		commit = "not recorded"
	}
	fmt.Fprintf(&b, "Machine: %s.\n\nCommand: `%s`\n\nCommit: %s\n\n", r.Machine, r.Command, commit)
	if r.Load[0] != "" {
		fmt.Fprintf(&b, "Load average (1, 5, 15 min): %s at the start, %s at the end.\n\n", r.Load[0], r.Load[1])
	}
	b.WriteString(r.method() + "\n\n")
	var rows [][]string
	for _, res := range r.Results {
		rows = append(rows, res.cells(r.held("atomic-sql"), r.judge()))
	}
	b.WriteString(mdTable(capacityColumns, rows))
	return b.String()
}

func (r CapacityReport) method() string {
	o := r.Options
	return fmt.Sprintf("%d instances per row; critical-section delay %s; lock wait budget %s. Each row first offers %.0f/s "+
		"for up to %d steps until one holds, results discarded (cold pools and a cold database would otherwise be measured). "+
		"Then the rate offered starts at %.0f/s "+
		"and grows ×%.2f every %s (open loop) until p99 of a successful purchase passes %s or more than %.1f %% of answers "+
		"are not 201 (a rate is within both if two of its steps are before two are past them, or if its first step is with "+
		"room to spare: no answer but 201 and p99 within half the SLO; any step after one past them runs behind a step at "+
		"the last rate within both, judged by nothing, so the service recovers from it first); then the gap between the last rate within both and "+
		"the first past them is halved %d times (geometric midpoints). **Held** is the highest rate within both. **Ceiling** is 1 / the serialized window of one sale, timed by one "+
		"client in a loop against the same servers in the same run: for a lock, acquire + the statements inside + release; "+
		"for the lock-free rows, the whole purchase. **Key busy** is the share of a step during which the SKU's lock was held "+
		"(the instances' shop_lock_hold_seconds, summed): what is left is the hand-offs between holders and any moment with "+
		"nobody waiting. Then %d rounds, each in the reverse order of the last, offer the rate "+
		"held again, twice it and four times it, one step each. **At 2×**: the p99 of the sales and the share turned away "+
		"with 503. **At 4×**: the sales per second over those of the same round's step at the rate held (the goodput kept "+
		"when flooded), so that a machine that slows down during the row moves both. Medians over the rounds, ranges in "+
		"brackets. **Flooded** is a step at the ceiling when that is more than 4× held (else the 4× steps): the sales per "+
		"second the key still makes when offered more than it takes. A row whose sales take the CPU at its rate held keeps "+
		"at most (s − 4·r) / (s − r) of them at 4× (the CPU of one sale held pays for the four requests that come in its "+
		"place, those sold and those refused), s its CPU per sale and r its CPU per refusal; **r0** = %.1f µs is the CPU per "+
		"request of a bare net/http server answering 503 (loadtest/refuser), flooded in this run at %d/s and timed the same "+
		"way (process CPU / requests). The verdict fails a row whose p99 at 2× passes the SLO (it queues what it should turn "+
		"away) or whose goodput at 4× is under its own bound 0.9·(s−4·r0)/(s−r0) (it spends on refusals more than a refusal "+
		"needs).",
		o.Instances, o.Delay, o.Probe.SLO*3/5, o.Probe.Start, o.Probe.WarmUp, o.Probe.Start, o.Probe.Factor, o.Probe.Step,
		o.Probe.SLO, 100*o.Probe.MaxErrors, o.Probe.Refine, o.Probe.Rounds, r.BareRefusalMicros, BareRefusalRate)
}

// held is the rate the named row held, 0 if it did not run.
func (r CapacityReport) held(name string) float64 {
	for _, res := range r.Results {
		if res.Spec.Name == name {
			return res.Held
		}
	}
	return 0
}

// Judge holds what a row's verdict is judged against: the latency SLO,
// and r0, the CPU µs a bare server spends per refusal on this machine.
type Judge struct {
	SLO               time.Duration
	BareRefusalMicros float64
}

// BareRefusalRate is the rate at which the capacity run floods the bare
// 503 server: about what a row's 4× step turns away, enough requests that
// /proc's 10 ms CPU ticks time r0 to a few %.
const BareRefusalRate = 1500

func (r CapacityReport) judge() Judge {
	return Judge{SLO: r.Options.Probe.SLO, BareRefusalMicros: r.BareRefusalMicros}
}

// GoodputBound is the least goodput at 4× the row must keep:
// capacity.GoodputBound with its median CPU per sale and r0.
func (res CapacityRow) GoodputBound(r0 float64) float64 {
	return capacity.GoodputBound(res.median(capacity.Round.CPUPerSale), r0)
}

// Goodput is the median over the rounds of what a round sold at four
// times the rate held over what it sold at the rate held; 0 without rounds.
func (res CapacityRow) Goodput() float64 {
	return res.median(func(r capacity.Round) float64 { return r.Goodput() })
}

// P99AtTwo is the median over the rounds of the p99 of the sales at twice
// the rate held, in ms.
func (res CapacityRow) P99AtTwo() float64 {
	return res.median(func(r capacity.Round) float64 { return r.AtTwo.P99 })
}

// median is the median of f over the rounds (the lower one of an even
// count), 0 without rounds.
func (res CapacityRow) median(f func(capacity.Round) float64) float64 {
	if len(res.Rounds) == 0 {
		return 0
	}
	v := make([]float64, len(res.Rounds))
	for i, r := range res.Rounds {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v[(len(v)-1)/2]
}

// spread is f's median over the rounds and, with more than one round, its
// range: "0.93 (0.88-1.02)".
func (res CapacityRow) spread(format string, f func(capacity.Round) float64) string {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, r := range res.Rounds {
		lo, hi = min(lo, f(r)), max(hi, f(r))
	}
	s := fmt.Sprintf(format, res.median(f))
	if len(res.Rounds) > 1 {
		s += fmt.Sprintf(" ("+format+"-"+format+")", lo, hi)
	}
	return s
}

// Problems are why the row fails the capacity verdict: it did not run, it
// queues past the SLO at twice its rate held instead of turning the excess
// away, or flooded at 4× it keeps less of its sales than its GoodputBound.
func (res CapacityRow) Problems(j Judge) []string {
	if res.Err != "" {
		return []string{"did not run: " + res.Err}
	}
	if res.Held == 0 {
		return []string{"held no rate"}
	}
	if len(res.Rounds) == 0 {
		return []string{"not offered 2× and 4×"}
	}
	var out []string
	if p99 := res.P99AtTwo(); p99 > float64(j.SLO.Milliseconds()) {
		out = append(out, fmt.Sprintf("p99 at 2× is %.0f ms, past the SLO %s", p99, j.SLO))
	}
	if g, least := res.Goodput(), res.GoodputBound(j.BareRefusalMicros); g < least {
		out = append(out, fmt.Sprintf("flooded at 4× it sold %.2f× what it sold at its rate held, under its bound %.2f×", g, least))
	}
	return out
}

// Failed names the rows whose Problems are not empty.
func (r CapacityReport) Failed() []string {
	var out []string
	for _, res := range r.Results {
		if len(res.Problems(r.judge())) > 0 {
			out = append(out, res.Spec.Name)
		}
	}
	return out
}

func (res CapacityRow) verdict(j Judge) string {
	if p := res.Problems(j); len(p) > 0 {
		return "FAILS: " + strings.Join(p, "; ")
	}
	return "ok"
}

func (res CapacityRow) cells(atomicSQL float64, j Judge) []string {
	if res.Err != "" {
		cells := make([]string, len(capacityColumns))
		cells[0], cells[1], cells[len(cells)-1] = res.Spec.Name, "did not run: "+res.Err, "FAILS: did not run"
		return cells
	}
	p99, over99, away, xs, flood, retries := "—", "—", "—", "—", "—", ""
	for _, st := range res.Steps {
		if st.Rate == res.Held && st.WithinSLO {
			p99 = fmt.Sprintf("%.0f ms", st.P99)
		}
	}
	four99, goodput, bound, cpu, runner := "—", "—", "—", "—", "—"
	if len(res.Rounds) > 0 {
		cpu = fmt.Sprintf("%.0f / %.0f", res.median(capacity.Round.CPUPerSale), res.median(capacity.Round.CPUPerRefusal))
		runner = fmt.Sprintf("%.0f", res.median(capacity.Round.RunnerCPUPerRequest))
		over99 = res.spread("%.0f", func(r capacity.Round) float64 { return r.AtTwo.P99 }) + " ms"
		away = fmt.Sprintf("%.0f %%", 100*res.median(func(r capacity.Round) float64 { return r.AtTwo.TurnedAway() }))
		four99 = fmt.Sprintf("%.0f ms", res.median(func(r capacity.Round) float64 { return r.AtFour.P99 }))
		goodput = res.spread("%.2f", capacity.Round.Goodput)
		bound = fmt.Sprintf("%.2f", res.GoodputBound(j.BareRefusalMicros))
	}
	if atomicSQL > 0 {
		xs = fmt.Sprintf("%.2f", res.Held/atomicSQL)
	}
	if f := res.Flood; f != nil {
		flood = fmt.Sprintf("%.0f → %.0f (%.0f ms)", f.Rate, f.SalesPerS, f.P99)
	} else if len(res.Rounds) > 0 {
		flood = fmt.Sprintf("%.0f → %.0f (%s)", 4*res.Held, res.median(func(r capacity.Round) float64 { return r.AtFour.SalesPerS }), four99)
	}
	if res.Spec.Strategy == "optimistic" {
		retries = fmt.Sprintf("%.2f", res.RetriesPerSale)
	}
	c := res.Ceiling
	return []string{res.Spec.Name, fmt.Sprintf("%.2f", c.SerializedMicros/1000), fmt.Sprintf("%.0f", c.CeilingPerSec),
		fmt.Sprintf("%.0f", res.Held), fmt.Sprintf("%.2f", res.Held/c.CeilingPerSec), res.keyBusy(), xs, p99, over99, away, flood,
		four99, goodput, bound, cpu, runner, retries, res.verdict(j)}
}

// keyBusy is the share of the rounds' steps the SKU's lock was held, at
// the rate held and at 4×, and how long a grant held it at 4×: a key busy
// near 1 at 4× sells as fast as its holds allow, one well under 1 loses
// its time between them. "—" on a lock-free row.
func (res CapacityRow) keyBusy() string {
	if res.median(func(r capacity.Round) float64 { return float64(r.AtFour.LockHolds) }) == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f / %.2f (%.2f ms)", res.median(func(r capacity.Round) float64 { return r.AtHeld.KeyBusy() }),
		res.median(func(r capacity.Round) float64 { return r.AtFour.KeyBusy() }),
		res.median(func(r capacity.Round) float64 { return r.AtFour.HoldMillis() }))
}
