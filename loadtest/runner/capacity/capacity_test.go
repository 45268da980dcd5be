package capacity

import (
	"context"
	"math"
	"testing"
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
	// 100, 200 (broken), 200 again, 400, 800 twice, then sqrt(400*800) twice.
	if want := 400.0; held != want {
		t.Errorf("held %.1f, want %.1f", held, want)
	}
	if len(steps) != 8 {
		t.Errorf("%d steps, want 8: %+v", len(steps), steps)
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
