package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/lockbench/shop/loadtest/runner/capacity"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// fakeService is the measured service: it holds every rate up to
// capacity, except its first cold steps (cold connection pools, keys not
// yet created), which break whatever their rate. It keeps the rates it
// was offered, and calls cancel at its cancelAt-th step.
type fakeService struct {
	capacity float64
	cold     int
	offered  []float64
	cancelAt int
	cancel   func()
}

func (f *fakeService) offer(rate float64) capacity.Step {
	f.offered = append(f.offered, rate)
	if f.cancel != nil && len(f.offered) == f.cancelAt {
		f.cancel()
	}
	held := rate <= f.capacity && len(f.offered) > f.cold
	return capacity.Step{Rate: rate, WithinSLO: held, SalesPerS: min(rate, f.capacity)}
}

func (f *fakeService) prober(c capacity.Options) prober {
	return prober{log: slog.New(slog.NewTextHandler(io.Discard, nil)), row: "redis", c: c, offer: f.offer}
}

// Each round runs the rate held, 2× and 4× it, in the reverse order of
// the round before, so that a machine that drifts during the row moves
// the baseline with the flood; each step lands in its place whatever the
// order.
func TestPastCapacityAlternatesTheOrderOfItsRounds(t *testing.T) {
	f := &fakeService{capacity: 1000}
	rounds, flood := f.prober(capacity.Options{Rounds: 3}).pastCapacity(context.Background(), 100, 0)
	if want := []float64{100, 200, 400, 400, 200, 100, 100, 200, 400}; !slices.Equal(f.offered, want) {
		t.Errorf("offered %v, want %v", f.offered, want)
	}
	if len(rounds) != 3 {
		t.Fatalf("%d rounds, want 3", len(rounds))
	}
	for i, r := range rounds {
		if r.AtHeld.Rate != 100 || r.AtTwo.Rate != 200 || r.AtFour.Rate != 400 {
			t.Errorf("round %d: %.0f, %.0f, %.0f", i+1, r.AtHeld.Rate, r.AtTwo.Rate, r.AtFour.Rate)
		}
	}
	if flood != nil {
		t.Errorf("flood at %.0f without a ceiling beyond 4×", flood.Rate)
	}
}

// The flood offers the key the most it can take, the ceiling, when that
// is beyond what the rounds' 4× step offered; a row that held nothing is
// flooded all the same, for its verdict's sake.
func TestTheFloodIsOfferedOnlyBeyondFourTimesTheRateHeld(t *testing.T) {
	cases := []struct {
		name          string
		held, ceiling float64
		rounds        int
		flood         float64 // 0: none
		stepsBeforeIt int
	}{
		{"ceiling beyond 4×", 100, 1000, 1, 1000, 3},
		{"ceiling within 4×", 100, 400, 1, 0, 3},
		{"nothing held", 0, 0, 3, 20, 0},
		{"nothing held, a ceiling", 0, 700, 3, 700, 0},
	}
	for _, c := range cases {
		f := &fakeService{capacity: 1000}
		rounds, flood := f.prober(capacity.Options{Rounds: c.rounds, Start: 20}).pastCapacity(context.Background(), c.held, c.ceiling)
		got := 0.0
		if flood != nil {
			got = flood.Rate
		}
		if got != c.flood || len(f.offered) != c.stepsBeforeIt+map[bool]int{true: 1}[c.flood > 0] {
			t.Errorf("%s: flood at %.0f after %v, want %.0f", c.name, got, f.offered, c.flood)
		}
		if c.held == 0 && len(rounds) != 0 {
			t.Errorf("%s: %d rounds around a rate never held", c.name, len(rounds))
		}
	}
}

// A round cut short by an interrupt would judge steps that never ran: it
// is dropped, and no flood follows.
func TestARoundCutShortIsDropped(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	f := &fakeService{capacity: 1000, cancelAt: 5, cancel: cancel}
	rounds, flood := f.prober(capacity.Options{Rounds: 3}).pastCapacity(ctx, 100, 5000)
	if len(rounds) != 1 || flood != nil {
		t.Errorf("%d rounds and flood %v after an interrupt in round 2, want 1 and none", len(rounds), flood)
	}
	if len(f.offered) != 6 {
		t.Errorf("offered %v: the interrupted round ran on or another began", f.offered)
	}
}

// A row's first steps meet a cold service. The warm-up offers the first
// rate until a step holds and keeps none of it: the search starts on a
// warm service and finds the rate it holds, where without the warm-up the
// cold steps would make it hold nothing.
func TestTheWarmUpKeepsColdStepsOutOfTheSearch(t *testing.T) {
	c := capacity.Options{Start: 20, Factor: 2, Max: 1000, WarmUp: 5, Rounds: 1}
	f := &fakeService{capacity: 300, cold: 2}
	res := report.CapacityRow{Ceiling: capacity.Ceiling{CeilingPerSec: 500}}
	f.prober(c).measure(context.Background(), &res)
	if !slices.Equal(f.offered[:4], []float64{20, 20, 20, 20}) {
		t.Errorf("offered %v, want three warm-up steps at the start rate, then the search's first", f.offered)
	}
	if res.Held != 160 || len(res.Steps) == 0 || res.Steps[0].Rate != 20 || !res.Steps[0].WithinSLO {
		t.Errorf("held %.0f, steps %+v; want 160 from a first step held", res.Held, res.Steps)
	}
	// 3 warm-up steps, the search's, one round, no flood (500 < 4 × 160).
	if got := 3 + len(res.Steps) + 3; len(f.offered) != got || len(res.Rounds) != 1 || res.Flood != nil {
		t.Errorf("offered %d steps, want %d; rounds %d, flood %v", len(f.offered), got, len(res.Rounds), res.Flood)
	}
	if r := res.Rounds[0]; r.AtHeld.Rate != 160 || r.AtFour.Rate != 640 {
		t.Errorf("round at %.0f and %.0f, want the rate held and 4× it", r.AtHeld.Rate, r.AtFour.Rate)
	}

	c.WarmUp = 0
	cold := &fakeService{capacity: 300, cold: 2}
	res = report.CapacityRow{}
	cold.prober(c).measure(context.Background(), &res)
	if res.Held != 0 {
		t.Errorf("without a warm-up a cold service held %.0f", res.Held)
	}
}

// A warm-up that never holds gives up after its steps: the search still
// runs and judges the row on its own steps, and a row that held nothing
// is flooded at the start rate.
func TestTheWarmUpStopsAfterItsSteps(t *testing.T) {
	c := capacity.Options{Start: 20, Factor: 2, Max: 100, WarmUp: 3, Rounds: 3}
	f := &fakeService{capacity: 10}
	res := report.CapacityRow{}
	f.prober(c).measure(context.Background(), &res)
	if len(f.offered) != 3+2+1 || res.Held != 0 || len(res.Steps) != 2 || len(res.Rounds) != 0 || res.Flood == nil {
		t.Errorf("offered %v, held %.0f in %d steps, %d rounds, flood %v; want 3 warm-up steps, "+
			"a step broken twice, nothing held, the flood", f.offered, res.Held, len(res.Steps), len(res.Rounds), res.Flood)
	}
}

// The log tells a settle step (run at the rate held after a break, and
// judged by nothing) from a step of the search.
func TestTheSearchLogsItsSettleSteps(t *testing.T) {
	var log bytes.Buffer
	stalled := false
	p := prober{log: slog.New(slog.NewJSONHandler(&log, nil)), row: "redis", c: capacity.Options{Start: 100, Factor: 2, Max: 400},
		offer: func(rate float64) capacity.Step {
			held := rate <= 200
			if rate == 200 && !stalled { // a neighbour's stall breaks 200/s once
				stalled, held = true, false
			}
			return capacity.Step{Rate: rate, WithinSLO: held}
		}}
	steps, held := p.search(context.Background())
	if held != 200 || len(steps) != 8 {
		t.Fatalf("held %.0f in %d steps", held, len(steps))
	}
	var got []string
	for dec := json.NewDecoder(&log); dec.More(); {
		var line struct{ Msg, Rate string }
		if err := dec.Decode(&line); err != nil {
			t.Fatal(err)
		}
		got = append(got, line.Msg+"@"+line.Rate)
	}
	// 100, 200 broken, settle at 100, 200 twice more (held on two of
	// three), 400 broken, settle at 200, 400 again.
	want := []string{"capacity step@100", "capacity step@200", "settle step@100", "capacity step@200",
		"capacity step@200", "capacity step@400", "settle step@200", "capacity step@400"}
	if !slices.Equal(got, want) {
		t.Errorf("logged\n%v\nwant\n%v", got, want)
	}
}
