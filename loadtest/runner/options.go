package main

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

func parseRows(s string, capacity bool) ([]string, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
	if len(fields) == 0 || (len(fields) == 1 && fields[0] == "all") {
		if capacity {
			return capacityRows, nil
		}
		return allRows, nil
	}
	for _, f := range fields {
		if !isRow(f) {
			return nil, fmt.Errorf("-backends has %q; want some of %s, or a lock backend + %q", f, strings.Join(allRows, " "), combinedSuffix)
		}
	}
	return fields, nil
}

func parseFlows(s string) ([]string, error) {
	fields := strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' })
	for _, f := range fields {
		if !slices.Contains(allFlows, f) {
			return nil, fmt.Errorf("-flows has %q; want some of %s", f, strings.Join(allFlows, ","))
		}
	}
	if len(fields) == 0 {
		return nil, errors.New("-flows is empty")
	}
	return fields, nil
}

func isRow(name string) bool {
	if base, ok := strings.CutSuffix(name, combinedSuffix); ok {
		return slices.Contains(capacityRows, base) && baseSpec(base, 1).Strategy == "lock"
	}
	return slices.Contains(allRows, name)
}

// within reports lo <= v <= hi.
func within[T int | float64 | time.Duration](v, lo, hi T) bool { return lo <= v && v <= hi }

// validate bounds every option in time and count: a typo must not turn
// into an hour of load.
func (o options) validate() error {
	p := o.Probe
	rules := []struct {
		ok  bool
		err string
	}{
		{within(o.Instances, 1, 8), fmt.Sprintf("-instances is %d; want 1 to 8", o.Instances)},
		{within(o.Duration, time.Second, 10*time.Minute), fmt.Sprintf("-duration is %s; want 1s to 10m", o.Duration)},
		{within(o.Rate, 0, 5000), fmt.Sprintf("-rate is %d; want 1 to 5000, or 0 for -fraction of the probed capacity", o.Rate)},
		{o.Fraction > 0 && o.Fraction <= 1, fmt.Sprintf("-fraction is %g; want above 0, at most 1", o.Fraction)},
		{within(o.Delay, 0, 5*time.Second), fmt.Sprintf("-delay is %s; want 0 to 5s", o.Delay)},
		{o.Stock >= 1, fmt.Sprintf("-stock is %d; want at least 1", o.Stock)},
		{within(o.MaxVUs, 1, 2000), fmt.Sprintf("-max-vus is %d; want 1 to 2000", o.MaxVUs)},
		{within(o.Users, 300, 1000), fmt.Sprintf("-users is %d; want 300 to 1000 (the flows use users 1..300, the fixture has 1000)", o.Users)},
		{p.SLO > 0, fmt.Sprintf("-slo is %s; want above 0", p.SLO)},
		{p.Step >= 500*time.Millisecond, fmt.Sprintf("-step is %s; want at least 500ms", p.Step)},
		{p.Start >= 1 && p.Max >= p.Start, fmt.Sprintf("-start-rate %g, -max-rate %g; want 1 <= -start-rate <= -max-rate", p.Start, p.Max)},
		{p.Factor > 1, fmt.Sprintf("-factor is %g; want above 1", p.Factor)},
		{p.MaxErrors >= 0 && p.MaxErrors < 1, fmt.Sprintf("-max-errors is %g; want 0 to below 1", p.MaxErrors)},
		{within(p.Refine, 0, 8), fmt.Sprintf("-refine is %d; want 0 to 8", p.Refine)},
		{within(p.Rounds, 1, 9), fmt.Sprintf("-rounds is %d; want 1 to 9", p.Rounds)},
	}
	var errs []error
	for _, r := range rules {
		if !r.ok {
			errs = append(errs, errors.New(r.err))
		}
	}
	return errors.Join(errs...)
}
