package report

import (
	"strings"
	"testing"
)

var (
	eventsRow = Row{Name: "events", Backend: "redis", Strategy: "lock", Flows: []string{"orders"}, Expect: ExpectClean,
		Delivery: DeliveryOutbox, Dedup: DedupInbox}
	noDedupRow = Row{Name: "events-none", Backend: "redis", Strategy: "lock", Flows: []string{"orders"}, Expect: ExpectDamage,
		Delivery: DeliveryOutbox, Dedup: DedupNone}
	directRow = Row{Name: "events-direct", Backend: "redis", Strategy: "lock", Flows: []string{"orders"}, Expect: ExpectDamage,
		Delivery: DeliveryDirect, Dedup: DedupInbox}
)

// drained is an events row's result after a run whose faults caused
// redeliveries; edit adjusts its events.
func drained(row Row, edit func(*Events)) Result {
	e := &Events{Written: 400, Paid: 120, Redelivered: 2, Republished: 1, Lag: Latency{P50: 40, P99: 5200, N: 120}}
	if edit != nil {
		edit(e)
	}
	audit := map[string]int64{CheckDuplicates: 0, "points_doubled": 0}
	if row.Dedup == DedupNone {
		audit["points_doubled"] = e.Doubled
	}
	return ran(row, audit, func(r *Result) { r.Sold, r.Stock, r.Rate, r.Events = 0, 0, 60, e })
}

func TestJudgeEvents(t *testing.T) {
	cases := []struct {
		name     string
		result   Result
		verdict  string
		problems []string // each is a part of one problem, in order
	}{
		{"the defaults with nothing lost or doubled are safe", drained(eventsRow, nil), VerdictSafe, nil},
		{"an outbox that lost an event is broken", drained(eventsRow, func(e *Events) { e.Lost = 1 }), VerdictBroken,
			[]string{"1 events lost: the outbox loses none"}},
		{"an inbox that doubled an effect is broken", drained(eventsRow, func(e *Events) { e.Doubled = 2 }), VerdictBroken,
			[]string{"2 effects doubled: the inbox dedup applies each event once"}},
		{"a delivered event never applied is broken", drained(eventsRow, func(e *Events) { e.Missing = 1 }), VerdictBroken,
			[]string{"1 paid orders whose event reached the stream were never credited"}},
		{"a run without a redelivery tested nothing", drained(eventsRow, func(e *Events) { e.Redelivered = 0 }), VerdictBroken,
			[]string{"no redelivery happened"}},
		{"a relay leader's kill that republished nothing tested nothing", drained(eventsRow, func(e *Events) { e.Republished = 0 }),
			VerdictBroken, []string{"no event republished"}},
		{"direct delivery has no relay to republish", drained(directRow, func(e *Events) { e.Lost, e.Republished = 4, 0 }),
			VerdictDamage, nil},
		{"a run without a paid order measured nothing", drained(eventsRow, func(e *Events) { e.Paid = 0 }), VerdictBroken,
			[]string{"no order paid"}},
		{"no dedup doubling an effect shows what it should", drained(noDedupRow, func(e *Events) { e.Doubled = 3 }),
			VerdictDamage, nil},
		{"no dedup that doubled nothing is inconclusive", drained(noDedupRow, nil), VerdictInconclusive,
			[]string{"no effect doubled (2 redeliveries)"}},
		{"no dedup loses nothing either: that is the outbox's", drained(noDedupRow, func(e *Events) { e.Doubled, e.Lost = 3, 1 }),
			VerdictInconclusive, []string{"1 events lost: the outbox loses none"}},
		{"direct delivery losing events shows what it should", drained(directRow, func(e *Events) { e.Lost = 4 }),
			VerdictDamage, nil},
		{"direct delivery that lost nothing is inconclusive", drained(directRow, nil), VerdictInconclusive,
			[]string{"no event lost: no publish fell in the broker's restart"}},
		{"an events row that was not measured proves nothing", ran(eventsRow, zeros(), func(r *Result) { r.Sold, r.Stock = 0, 0 }),
			VerdictBroken, []string{"no events measured"}},
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

// The events table has a row per events row, with its ways, its damage
// and its lag, in the Markdown record, the terminal table and the page;
// a report without events rows has no such table.
func TestReportsShowTheEventsTable(t *testing.T) {
	rep := sample()
	if strings.Contains(rep.Markdown(), "## Events") || strings.Contains(page(t, rep), "Events: lost") {
		t.Error("a report without events rows shows an events table")
	}
	r := drained(noDedupRow, func(e *Events) { e.Doubled = 3; e.Faults = []string{"broker restarted (away 400ms)"} })
	r.Judge()
	rep.Results = append(rep.Results, r)
	md := rep.Markdown()
	for _, want := range []string{"## Events", "; events rows: 3 instances, the orders flow alone at 12 orders/s", "| events lost | effects doubled | lag p50 | lag p99 | faults | verdict |",
		"| events-none | outbox | none | 120 | 400 | 2 | 1 | 0 | 3 | 40.0 ms | 5200 ms | broker restarted (away 400ms) | " + VerdictDamage} {
		if !strings.Contains(md, want) {
			t.Errorf("report.md has no %q", want)
		}
	}
	only := Report{Options: rep.Options, Results: []Result{r}}
	if got := only.Settings(); !strings.HasPrefix(got, "events rows:") {
		t.Errorf("a run of events rows only is described as %q", got)
	}
	if table := rep.Table(); !strings.Contains(table, "| delivery | dedup |") || !strings.Contains(table, "| 5200 ms | "+VerdictDamage) {
		t.Errorf("the terminal table has no events row:\n%s", table)
	}
	p := page(t, rep)
	if !strings.Contains(p, "Events: lost") || !strings.Contains(p, `<td class="dmg">3</td><td>40.0 ms</td><td>5200 ms</td>`) {
		t.Errorf("the page has no events table with events-none's doubled effects and lag:\n%s", p[strings.Index(p, "Events"):])
	}
}
