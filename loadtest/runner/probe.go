package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/lockbench/shop/loadtest/runner/capacity"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// prober runs one row's capacity steps with offer, which runs one step at
// a rate, and logs every step.
type prober struct {
	log   *slog.Logger
	row   string
	c     capacity.Options
	offer func(rate float64) capacity.Step
}

// measure fills res, whose ceiling is known, with the row's capacity: the
// warm-up (its steps only logged), the search for the rate held, then the
// rounds past it and the flood.
func (p prober) measure(ctx context.Context, res *report.CapacityRow) {
	for _, w := range capacity.WarmUp(ctx, p.c, p.offer) {
		p.log.Info("warm-up step", "row", p.row, "rate", fmt.Sprintf("%.0f", w.Rate), "p99_ms", fmt.Sprintf("%.1f", w.P99),
			"errors", fmt.Sprintf("%.3f", w.ErrorRate), "held", w.WithinSLO)
	}
	res.Steps, res.Held = p.search(ctx)
	res.Rounds, res.Flood = p.pastCapacity(ctx, res.Held, res.Ceiling.CeilingPerSec)
}

// search runs the capacity search and returns its steps and the rate held.
func (p prober) search(ctx context.Context) ([]capacity.Step, float64) {
	return capacity.Search(ctx, p.c, func(rate float64, try int) capacity.Step {
		s := p.offer(rate)
		what := "capacity step"
		if try == capacity.Settle {
			what = "settle step"
		}
		p.log.Info(what, "row", p.row, "rate", fmt.Sprintf("%.0f", rate), "sold_per_s", fmt.Sprintf("%.0f", s.SalesPerS),
			"p99_ms", fmt.Sprintf("%.1f", s.P99), "errors", fmt.Sprintf("%.3f", s.ErrorRate), "held", s.WithinSLO, "try", try+1)
		return s
	})
}

// pastCapacity runs c.Rounds rounds past capacity (capacity.Round), each
// in the reverse order of the last, then the flood: a step at the ceiling
// if that is more than four times the rate held (the most a flood can
// offer this key).
func (p prober) pastCapacity(ctx context.Context, held, ceiling float64) (rounds []capacity.Round, flood *capacity.Step) {
	for i := 0; held > 0 && i < p.c.Rounds && ctx.Err() == nil; i++ {
		var r capacity.Round
		steps := []struct {
			what string
			rate float64
			into *capacity.Step
		}{{"held", held, &r.AtHeld}, {"2x", 2 * held, &r.AtTwo}, {"4x", 4 * held, &r.AtFour}}
		if i%2 == 1 {
			slices.Reverse(steps)
		}
		for _, st := range steps {
			*st.into = p.step(st.what, st.rate)
		}
		if ctx.Err() != nil {
			break // a round cut short would judge steps that never ran
		}
		rounds = append(rounds, r)
	}
	if ctx.Err() == nil && (held == 0 || ceiling > 4*held) {
		s := p.step("flood", max(4*held, ceiling, p.c.Start))
		flood = &s
	}
	return rounds, flood
}

// step offers one step past capacity and logs it as what.
func (p prober) step(what string, rate float64) capacity.Step {
	s := p.offer(rate)
	p.log.Info(what+" step", "row", p.row, "rate", fmt.Sprintf("%.0f", s.Rate), "sold_per_s", fmt.Sprintf("%.0f", s.SalesPerS),
		"p99_ms", fmt.Sprintf("%.1f", s.P99), "turned_away", fmt.Sprintf("%.2f", s.TurnedAway()))
	return s
}
