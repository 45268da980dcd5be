package capacity

import (
	"context"
	"math"
	"slices"
	"testing"
	"time"
)

// holdsUpTo is a service that holds every rate up to capacity.
func holdsUpTo(capacity float64) func(rate float64, try int) Step {
	return func(rate float64, try int) Step {
		return Step{Rate: rate, WithinSLO: rate <= capacity}
	}
}

func TestSearchNarrowsTheLastStep(t *testing.T) {
	c := Options{Start: 20, Factor: 1.25, Max: 3000, Refine: 2}
	for _, capacity := range []float64{100, 384, 455, 560, 1999} {
		_, held := Search(context.Background(), c, holdsUpTo(capacity))
		// Two halvings of a ×1.25 step leave a gap of 1.25^(1/4).
		if held > capacity || held < capacity/math.Pow(1.25, 0.25) {
			t.Errorf("capacity %.0f: held %.1f, want within [%.1f, %.0f]", capacity, held, capacity/math.Pow(1.25, 0.25), capacity)
		}
	}
}

func TestSearchWithoutRefineStopsAtTheLastStepHeld(t *testing.T) {
	c := Options{Start: 20, Factor: 1.25, Max: 3000}
	_, held := Search(context.Background(), c, holdsUpTo(400))
	if want := 20 * math.Pow(1.25, 13); math.Abs(held-want) > 1e-6 { // 363.8, the next is 454.7
		t.Errorf("held %.1f, want %.1f", held, want)
	}
}

func TestSearchRunsABrokenStepAgain(t *testing.T) {
	c := Options{Start: 100, Factor: 2, Max: 1000, Refine: 1}
	stalls := map[float64]bool{200: true} // a neighbour's stall breaks 200/s once
	steps, held := Search(context.Background(), c, func(rate float64, try int) Step {
		if stalls[rate] && try == 0 {
			return Step{Rate: rate}
		}
		return Step{Rate: rate, WithinSLO: rate <= 500}
	})
	// 100, 200 (broken), 200 twice more (it must hold two of three), 400,
	// 800 twice, then sqrt(400*800) twice, each step after a broken one
	// behind a settle step at 100 or 400.
	if want := 400.0; held != want {
		t.Errorf("held %.1f, want %.1f", held, want)
	}
	settles := 0
	for _, s := range steps {
		if s.Rate == 100 || s.Rate == 400 {
			settles++
		}
	}
	if len(steps) != 13 || settles != 2+4 {
		t.Errorf("%d steps, %d at a rate held, want 13 and 6: %+v", len(steps), settles, steps)
	}
}

// A rate that holds on one try of three is not held, however it began:
// one quiet moment of the machine is not the service's capacity.
func TestSearchDoesNotTakeALuckyStep(t *testing.T) {
	c := Options{Start: 100, Factor: 2, Max: 1000, SLO: 100 * time.Millisecond}
	for _, lucky := range []int{0, 1} { // on try 3 it is never run: two broke first
		var tries []int
		steps, held := Search(context.Background(), c, func(rate float64, try int) Step {
			if rate != 400 {
				return Step{Rate: rate, WithinSLO: rate < 400, P99: 10}
			}
			tries = append(tries, try)
			// Within the SLO but not by much: a pass that needs a second.
			return Step{Rate: rate, WithinSLO: try == lucky, P99: 80}
		})
		if held != 200 {
			t.Errorf("400/s held on try %d only: held %.0f, want 200: %+v", lucky+1, held, steps)
		}
		if len(tries) != 3 {
			t.Errorf("400/s held on try %d only: tried %v, want three tries", lucky+1, tries)
		}
	}
}

// A first try that holds with room to spare is taken alone; one that
// holds near a bound is tried again.
func TestSearchConfirmsOnlyAMarginalPass(t *testing.T) {
	c := Options{Start: 100, Factor: 2, Max: 1000, SLO: 100 * time.Millisecond}
	steps, held := Search(context.Background(), c, func(rate float64, try int) Step {
		switch rate {
		case 100:
			return Step{Rate: rate, WithinSLO: true, P99: 20}
		case 200:
			return Step{Rate: rate, WithinSLO: true, P99: 20, ErrorRate: 0.001}
		case 400:
			return Step{Rate: rate, WithinSLO: true, P99: 70}
		}
		return Step{Rate: rate}
	})
	var rates []float64
	for _, s := range steps {
		rates = append(rates, s.Rate)
	}
	// 100 once; 200 (an error) and 400 (p99 past half the SLO) twice;
	// 800 broken twice, behind a settle step at 400.
	want := []float64{100, 200, 200, 400, 400, 800, 400, 800}
	if held != 400 || !slices.Equal(rates, want) {
		t.Errorf("held %.0f after %v, want 400 after %v", held, rates, want)
	}
}

// A step that breaks leaves the service throttled for the next step (its
// admission limit falls with the latency it saw): a rerun right after it
// would measure the recovery, not the rate.
func TestSearchLetsTheServiceSettleBeforeItRunsABrokenStepAgain(t *testing.T) {
	c := Options{Start: 100, Factor: 2, Max: 1000}
	stalled, throttled := false, false
	steps, held := Search(context.Background(), c, func(rate float64, try int) Step {
		within := rate <= 500 && !throttled
		if rate == 200 && !stalled { // a neighbour's stall breaks 200/s once
			stalled, within = true, false
		}
		throttled = !within && !throttled
		return Step{Rate: rate, WithinSLO: within}
	})
	if held != 400 {
		t.Errorf("held %.1f, want 400: %+v", held, steps)
	}
}

func TestSearchThatNeverBreaksIsNotRefined(t *testing.T) {
	c := Options{Start: 100, Factor: 2, Max: 1000, Refine: 3}
	steps, held := Search(context.Background(), c, holdsUpTo(1e9))
	if held != 800 || len(steps) != 4 {
		t.Errorf("held %.0f after %d steps, want 800 after 4", held, len(steps))
	}
}

func TestSearchThatBreaksAtTheFirstStepHoldsNothing(t *testing.T) {
	c := Options{Start: 100, Factor: 2, Max: 1000, Refine: 3}
	steps, held := Search(context.Background(), c, holdsUpTo(50))
	if held != 0 || len(steps) != 2 {
		t.Errorf("held %.0f after %d steps, want 0 after the first step twice", held, len(steps))
	}
}

func TestSearchStopsWhenItsContextEnds(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	c := Options{Start: 100, Factor: 2, Max: 1e6, Refine: 3}
	steps, held := Search(ctx, c, func(rate float64, try int) Step {
		if rate >= 400 {
			cancel()
		}
		return Step{Rate: rate, WithinSLO: true}
	})
	if held != 400 || len(steps) != 3 {
		t.Errorf("held %.0f after %d steps, want 400 after 3", held, len(steps))
	}
}

func TestWarmUpStopsAtTheFirstStepThatHolds(t *testing.T) {
	c := Options{Start: 20, WarmUp: 5}
	cold := 2 // the first two steps meet a cold database
	var rates []float64
	steps := WarmUp(context.Background(), c, func(rate float64) Step {
		rates = append(rates, rate)
		cold--
		return Step{Rate: rate, WithinSLO: cold < 0}
	})
	if len(steps) != 3 || !steps[2].WithinSLO {
		t.Errorf("%d warm-up steps %+v, want 3, the last held", len(steps), steps)
	}
	for _, r := range rates {
		if r != 20 {
			t.Errorf("warm-up offered %.0f/s, want the start rate 20/s", r)
		}
	}
}

func TestWarmUpGivesUpAfterItsSteps(t *testing.T) {
	c := Options{Start: 20, WarmUp: 3}
	steps := WarmUp(context.Background(), c, func(rate float64) Step { return Step{Rate: rate} })
	if len(steps) != 3 {
		t.Errorf("%d warm-up steps, want 3", len(steps))
	}
	if steps := WarmUp(context.Background(), Options{Start: 20}, func(float64) Step {
		t.Error("WarmUp 0 offered a step")
		return Step{}
	}); len(steps) != 0 {
		t.Errorf("WarmUp 0 ran %d steps", len(steps))
	}
}

func TestGoodputBoundFollowsTheCostOfARefusal(t *testing.T) {
	for _, tc := range []struct{ perSale, perRefusal, share float64 }{
		{1000, 0, 1}, // refusals are free: every sale is kept
		// 4 requests for each sale held: x sales and 4 - x refusals in the
		// CPU of one sale, 900x + 100(4 - x) = 900, x = 500 / 800.
		{900, 100, 0.625},
		{600, 150, 0}, // refusing all 4 alone takes the CPU of the sale held
		{600, 200, 0}, // and more
		{2500, 50, 2300.0 / 2450},
		{0, 50, 0}, // no sale measured: nothing to keep
	} {
		if got := FloodShare(tc.perSale, tc.perRefusal); math.Abs(got-tc.share) > 1e-9 {
			t.Errorf("FloodShare(%.0f, %.0f) = %.4f, want %.4f", tc.perSale, tc.perRefusal, got, tc.share)
		}
		if got, want := GoodputBound(tc.perSale, tc.perRefusal), 0.9*tc.share; math.Abs(got-want) > 1e-9 {
			t.Errorf("GoodputBound(%.0f, %.0f) = %.4f, want %.4f", tc.perSale, tc.perRefusal, got, want)
		}
	}
}

// A full line sells more cheaply than one that empties between sales: the
// refusal's cost is what 4× adds to 2×, not what 4× spends beyond the
// sales' cost at the rate held, which would come out negative here.
func TestCPUPerRefusalIsWhatFourTimesAddsToTwice(t *testing.T) {
	r := Round{
		AtHeld: Step{Sold: 900, ServiceCPU: 0.9 * 2.2},                     // 2,200 µs a sale
		AtTwo:  Step{Sold: 1000, Busy: 800, ServiceCPU: 1.0*1.5 + 0.8*0.1}, // 1,500 µs a sale once the line is full
		AtFour: Step{Sold: 1000, Busy: 2600, ServiceCPU: 1.0*1.5 + 2.6*0.1},
	}
	if got := r.CPUPerRefusal(); math.Abs(got-100) > 0.01 {
		t.Errorf("CPU per refusal %.2f µs, want 100", got)
	}
	if got := (Round{AtFour: Step{Busy: 10}, AtTwo: Step{Busy: 10}}).CPUPerRefusal(); got != 0 {
		t.Errorf("no 503 added at 4×: %.2f µs per refusal, want 0", got)
	}
}
