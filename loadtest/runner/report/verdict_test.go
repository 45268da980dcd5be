package report

import (
	"slices"
	"strings"
	"testing"
)

var (
	lockRow    = Row{Name: "redis", Backend: "redis", Strategy: "lock", Flows: []string{"seckill", "balance", "likes", "orders", "limit"}, Expect: ExpectClean}
	noFenceRow = Row{Name: "redlock", Backend: "redlock", Strategy: "lock", Flows: lockRow.Flows, Expect: ExpectClean, NoFence: true}
	unsafeRow  = Row{Name: "none", Backend: "none", Strategy: "lock", Flows: lockRow.Flows, Expect: ExpectDamage}
)

// ran is a row's result after a run that sold out and found what audit
// says; edit adjusts it.
func ran(row Row, audit map[string]int64, edit func(*Result)) Result {
	r := Result{Spec: row, Stock: 300, Sold: 300, AuditOK: true, Audit: audit}
	for _, v := range audit {
		if v != 0 {
			r.AuditOK = false
		}
	}
	if edit != nil {
		edit(&r)
	}
	return r
}

func zeros() map[string]int64 {
	return map[string]int64{CheckOversold: 0, CheckBalance: 0, CheckLikes: 0, CheckDuplicates: 0}
}

func with(check string, v int64) map[string]int64 {
	a := zeros()
	a[check] = v
	return a
}

func TestJudge(t *testing.T) {
	cases := []struct {
		name     string
		result   Result
		verdict  string
		problems []string // each is a part of one problem, in order
	}{
		{"a lock row with no damage is safe", ran(lockRow, zeros(), nil), VerdictSafe, nil},
		{"a lock row with damage is broken", ran(lockRow, with(CheckOversold, 3), nil), VerdictBroken,
			[]string{"audit oversold_units = 3, want 0", "audit ok = false"}},
		{"a lock row that starved the sale is broken", ran(lockRow, zeros(), func(r *Result) { r.Sold = 1 }), VerdictBroken,
			[]string{"sold 1 of 300 units: the lock starved the sale"}},
		{"a lock row whose writes were fenced had two holders", ran(lockRow, zeros(), func(r *Result) { r.Fenced = 2 }), VerdictBroken,
			[]string{"2 writes refused as stale"}},
		{"a lock row that crossed a safety threshold is broken",
			ran(lockRow, zeros(), func(r *Result) { r.K6Exit, r.Crossed = 99, []string{"seckill_sold count<=300"} }), VerdictBroken,
			[]string{"k6 threshold crossed: seckill_sold count<=300"}},
		{"a service-level threshold is not a safety one",
			ran(lockRow, zeros(), func(r *Result) { r.K6Exit, r.Crossed = 99, []string{"http_req_failed rate<0.05"} }), VerdictSafe, nil},
		{"k6 failing is a problem of the run", ran(lockRow, zeros(), func(r *Result) { r.K6Exit = 107 }), VerdictBroken,
			[]string{"k6 exited 107"}},
		{"a row without an audit proves nothing", ran(lockRow, nil, nil), VerdictBroken, []string{"no audit"}},
		{"a row that sold nothing measured nothing", ran(lockRow, zeros(), func(r *Result) { r.Sold = 0 }), VerdictBroken,
			[]string{"nothing sold", "sold 0 of 300"}},
		{"an unfenced lock with no damage is marked unsafe when a holder pauses", ran(noFenceRow, zeros(), nil), VerdictNoFence, nil},
		{"an unfenced lock with damage is broken", ran(noFenceRow, with(CheckBalance, 10), nil), VerdictBroken,
			[]string{"audit balance_drift = 10, want 0", "audit ok = false"}},
		{"a lock row that sold past the per-user limit is broken", ran(lockRow, zeros(), func(r *Result) { r.OverLimit = 2 }), VerdictBroken,
			[]string{"units sold past the per-user limit: 2"}},
		{"an unsafe row that sold past the per-user limit is broken too: the limit needs no lock",
			ran(unsafeRow, with(CheckOversold, 733), func(r *Result) { r.OverLimit = 1 }), VerdictBroken,
			[]string{"units sold past the per-user limit: 1"}},
		{"an unsafe row with damage shows what it should", ran(unsafeRow, with(CheckOversold, 733), nil), VerdictDamage, nil},
		{"an unsafe row caught by its fences shows what it should", ran(unsafeRow, zeros(), func(r *Result) { r.Fenced = 40 }),
			"unsafe (expected), caught by the fences: 40 stale writes refused", nil},
		{"an unsafe row that should show damage and does not is inconclusive", ran(unsafeRow, zeros(), nil), VerdictInconclusive,
			[]string{"no damage found and no write fenced"}},
		{"a row that did not run says why", Result{Spec: lockRow, Err: "redis: connection refused"}, VerdictDidNotRun,
			[]string{"redis: connection refused"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := c.result
			r.Judge()
			if r.Verdict != c.verdict {
				t.Errorf("verdict %q, want %q (problems %q)", r.Verdict, c.verdict, r.Problems)
			}
			if len(r.Problems) != len(c.problems) {
				t.Fatalf("problems %q, want %d matching %q", r.Problems, len(c.problems), c.problems)
			}
			for i, p := range c.problems {
				if !strings.Contains(r.Problems[i], p) {
					t.Errorf("problem %d is %q, want it to contain %q", i, r.Problems[i], p)
				}
			}
		})
	}
}

// Judging again starts over: a report rendered again from its results
// does not carry the problems of the first verdict twice.
func TestJudgeAgainGivesTheSameVerdict(t *testing.T) {
	r := ran(lockRow, with(CheckLikes, 1), nil)
	r.Judge()
	first := slices.Clone(r.Problems)
	r.Judge()
	if !slices.Equal(first, r.Problems) {
		t.Errorf("problems %q, then %q", first, r.Problems)
	}
}

// A row's failures carry its name and verdict, for the runner's FAIL list.
func TestFailuresNameTheRow(t *testing.T) {
	r := ran(lockRow, with(CheckOversold, 3), nil)
	r.Judge()
	rep := Report{Results: []Result{r, ran(unsafeRow, with(CheckOversold, 9), nil)}}
	rep.Results[1].Judge()
	got := rep.Failures()
	if len(got) != 2 || !strings.HasPrefix(got[0], "redis (BROKEN): audit oversold_units = 3") {
		t.Errorf("failures %q", got)
	}
}
