package report

import (
	"fmt"
	"maps"
	"slices"
	"strings"
)

// The verdicts a row can get.
const (
	VerdictSafe         = "safe: zero damage"
	VerdictNoFence      = "zero damage here; no fence: unsafe when a holder pauses"
	VerdictBroken       = "BROKEN"
	VerdictDamage       = "unsafe (expected): damage found"
	VerdictInconclusive = "INCONCLUSIVE"
	VerdictDidNotRun    = "did not run"
)

// A check is one way a row's result can contradict its row's promise; it
// applies to the rows of expect, or to every row when expect is "".
type check struct {
	expect   Expectation
	problems func(Result) []string
}

var checks = []check{
	{"", k6Failed},
	{"", noAudit},
	{"", soldNothing},
	{"", overLimit},
	{"", eventsNotAsPromised},
	{ExpectClean, auditNotZero},
	{ExpectClean, starved},
	{ExpectClean, overlapped},
	{ExpectClean, safetyCrossed},
	{ExpectDamage, raceNotShown},
}

// Judge sets Verdict and Problems: the problems are what the checks of the
// row's expectation found; the verdict names the outcome.
func (r *Result) Judge() {
	r.Problems = nil
	if r.Err != "" {
		r.Verdict, r.Problems = VerdictDidNotRun, []string{r.Err}
		return
	}
	for _, c := range checks {
		if c.expect == "" || c.expect == r.Spec.Expect {
			r.Problems = append(r.Problems, c.problems(*r)...)
		}
	}
	r.Verdict = verdict(*r)
}

func verdict(r Result) string {
	damageRow := r.Spec.Expect == ExpectDamage
	switch {
	case r.Spec.Runs("limit") && r.OverLimit > 0:
		return VerdictBroken // whatever the row: see overLimit
	case damageRow && len(r.Problems) > 0:
		return VerdictInconclusive
	case damageRow && r.Damage() > 0:
		return VerdictDamage
	case damageRow:
		return fmt.Sprintf("unsafe (expected), caught by the fences: %d stale writes refused", r.Fenced)
	case len(r.Problems) > 0:
		return VerdictBroken
	case r.Spec.NoFence:
		return VerdictNoFence
	}
	return VerdictSafe
}

func k6Failed(r Result) []string {
	if r.K6Exit != 0 && r.K6Exit != 99 {
		return []string{fmt.Sprintf("k6 exited %d (99 would be thresholds; this is an error)", r.K6Exit)}
	}
	return nil
}

func noAudit(r Result) []string {
	if r.Audit == nil {
		return []string{"no audit"}
	}
	return nil
}

func soldNothing(r Result) []string {
	if r.Spec.Runs("seckill") && r.Sold == 0 {
		return []string{"nothing sold: the row measured nothing"}
	}
	return nil
}

// overLimit: the per-user limit is one conditional UPDATE in the sale's
// transaction, atomic whatever the lock, so no row may sell past it (not
// even none's, whose damage is elsewhere).
func overLimit(r Result) []string {
	if r.Spec.Runs("limit") && r.OverLimit > 0 {
		return []string{fmt.Sprintf("units sold past the per-user limit: %d; it holds under every strategy", r.OverLimit)}
	}
	return nil
}

func auditNotZero(r Result) []string {
	var out []string
	for _, name := range slices.Sorted(maps.Keys(r.Audit)) {
		if v := r.Audit[name]; v != 0 {
			out = append(out, fmt.Sprintf("audit %s = %d, want 0", name, v))
		}
	}
	if r.Audit != nil && !r.AuditOK {
		out = append(out, "audit ok = false")
	}
	return out
}

// starved: a lock must let the sale finish, not only keep it correct. A
// lock that is never freed (a broken release) sells one unit and then
// times out every buyer, with zero damage. Rate x duration is kept well
// above the stock, so every working lock sells out.
func starved(r Result) []string {
	if r.Spec.Runs("seckill") && r.Stock > 0 && r.Sold < r.Stock {
		return []string{fmt.Sprintf("sold %d of %d units: the lock starved the sale", r.Sold, r.Stock)}
	}
	return nil
}

// overlapped: nothing here pauses a holder past its lease (the watchdog
// renews it), so a refused stale write means two holders overlapped: the
// fence saved the data, but the lock is broken.
func overlapped(r Result) []string {
	if r.Fenced > 0 {
		return []string{fmt.Sprintf("%d writes refused as stale (fenced): two holders overlapped", r.Fenced)}
	}
	return nil
}

// safetyMetrics are the k6 thresholds that a correct service never
// crosses whatever its speed: more sales than stock, two orders for one key.
var safetyMetrics = []string{"seckill_sold", "orders_duplicate_seen"}

func safetyCrossed(r Result) []string {
	var out []string
	for _, c := range r.Crossed {
		if slices.ContainsFunc(safetyMetrics, func(m string) bool { return strings.HasPrefix(c, m+" ") }) {
			out = append(out, "k6 threshold crossed: "+c)
		}
	}
	return out
}

// raceNotShown: an unsafe row that neither damaged anything nor had a
// write fenced proves nothing about the locks beside it. An events row's
// damage has its own check (eventsNotAsPromised).
func raceNotShown(r Result) []string {
	if r.Audit != nil && !r.Spec.IsEvents() && r.Damage() == 0 && r.Fenced == 0 {
		return []string{"no damage found and no write fenced: raise -rate or -delay until the unsafe row races"}
	}
	return nil
}
