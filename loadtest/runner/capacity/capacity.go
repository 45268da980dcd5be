// Package capacity finds the highest purchase rate one hot SKU holds: it
// offers rates in open-loop steps, each faster than the last, until a step
// breaks the latency SLO or the error budget, then narrows the gap between
// the last rate held and the first one broken.
package capacity

import (
	"context"
	"math"
	"time"
)

// Options are the knobs of the search for the highest rate held.
type Options struct {
	SLO       time.Duration `json:"slo"`        // p99 of a successful purchase must stay within it
	MaxErrors float64       `json:"max_errors"` // fraction of answers other than 201 allowed
	Step      time.Duration `json:"step"`       // length of each rate step
	Start     float64       `json:"start_rate"` // first rate offered, purchases/s
	Factor    float64       `json:"factor"`     // each step offers this times the previous rate
	Refine    int           `json:"refine"`     // halvings of the last step's gap once a step breaks
	Max       float64       `json:"max_rate"`   // the search stops here
	Rounds    int           `json:"rounds"`     // rounds past capacity (Round) once the rate held is known
	WarmUp    int           `json:"warm_up"`    // most steps at Start before the search, until one holds (WarmUp)
}

// Step is one rate offered for one step.
type Step struct {
	Rate       float64 `json:"rate"`
	Offered    int     `json:"offered"`
	Sold       int     `json:"sold"`
	Busy       int     `json:"busy_503"`
	Other      int     `json:"other_errors"`
	ErrorRate  float64 `json:"error_rate"`
	P50        float64 `json:"p50_ms"`
	P99        float64 `json:"p99_ms"`
	SalesPerS  float64 `json:"sales_per_sec"`
	WithinSLO  bool    `json:"within_slo"`
	FirstError string  `json:"first_error,omitempty"`
	// CPU seconds the row's instances and the runner (the buyers' side)
	// used during the step.
	ServiceCPU float64 `json:"service_cpu_s"`
	RunnerCPU  float64 `json:"runner_cpu_s"`
	// Seconds is how long the step took, to its last answer.
	Seconds float64 `json:"seconds"`
	// LockHeldS is how long the instances held the SKU's lock during the
	// step, summed over its LockHolds grants (lock rows only).
	LockHeldS float64 `json:"lock_held_s,omitempty"`
	LockHolds int     `json:"lock_holds,omitempty"`
}

// KeyBusy is the share of the step the SKU's lock was held: what is left
// is the hand-offs between holders, or a line with nobody in it.
func (s Step) KeyBusy() float64 {
	if s.Seconds == 0 {
		return 0
	}
	return s.LockHeldS / s.Seconds
}

// HoldMillis is the mean time one grant held the SKU's lock, in ms.
func (s Step) HoldMillis() float64 {
	if s.LockHolds == 0 {
		return 0
	}
	return 1000 * s.LockHeldS / float64(s.LockHolds)
}

// TurnedAway is the share of the step's purchases answered 503.
func (s Step) TurnedAway() float64 { return float64(s.Busy) / float64(max(s.Offered, 1)) }

// Round is one pass over the rates past capacity: the rate held again, as
// the baseline the others are judged against, then twice and four times
// it. A row runs several, in alternating order, so that a machine that
// slows down or speeds up during the row moves the baseline with the
// flood instead of deciding the verdict.
type Round struct {
	AtHeld Step `json:"at_held"`
	AtTwo  Step `json:"at_2x"`
	AtFour Step `json:"at_4x"`
}

// Goodput is what the round sold per second at four times the rate held,
// over what it sold at the rate held.
func (r Round) Goodput() float64 {
	if r.AtHeld.SalesPerS == 0 {
		return 0
	}
	return r.AtFour.SalesPerS / r.AtHeld.SalesPerS
}

// CPUPerSale is what the instances spent per sale at the rate held, in
// µs: nearly every answer there is a sale.
func (r Round) CPUPerSale() float64 {
	return perAnswer(r.AtHeld.ServiceCPU, r.AtHeld.Sold)
}

// CPUPerRefusal is what the instances spent per 503, in µs: their CPU at
// four times the rate held beyond that at twice it, over the 503s added.
// The key is full at both, so both sell about as much, and more cheaply
// than at the rate held (a full line wakes fewer waiters per grant): the
// few sales more or less are charged at CPUPerSale.
func (r Round) CPUPerRefusal() float64 {
	extra := r.AtFour.ServiceCPU - r.AtTwo.ServiceCPU - r.CPUPerSale()/1e6*float64(r.AtFour.Sold-r.AtTwo.Sold)
	return perAnswer(extra, r.AtFour.Busy-r.AtTwo.Busy)
}

// RunnerCPUPerRequest is what the runner spent sending one purchase and
// reading its answer at four times the rate held, in µs.
func (r Round) RunnerCPUPerRequest() float64 {
	return perAnswer(r.AtFour.RunnerCPU, r.AtFour.Offered)
}

func perAnswer(cpuSeconds float64, n int) float64 {
	if n <= 0 {
		return 0
	}
	return cpuSeconds * 1e6 / float64(n)
}

// WarmUp offers c.Start, one step at a time, until a step holds or c.WarmUp
// steps have run, and returns the steps for the log only: a row's first
// purchases meet cold connection pools, a cold buffer pool and lock keys
// that do not exist yet, and a first search step that pays for them finds
// a rate the row does not have.
func WarmUp(ctx context.Context, c Options, offer func(rate float64) Step) []Step {
	var steps []Step
	for len(steps) < c.WarmUp && ctx.Err() == nil {
		s := offer(c.Start)
		steps = append(steps, s)
		if s.WithinSLO {
			break
		}
	}
	return steps
}

// FloodShare is the share of its sales a row keeps when offered four times
// the rate it held, if sales took all the CPU at that rate: for every sale
// held, four requests now come, and the CPU of that one sale pays for the
// x of them sold and the 4 - x refused. From x·s + (4 - x)·r = s, sales
// keep x = (s - 4r) / (s - r), and none once refusing all four alone
// takes a sale's CPU. s and r (perSale, perRefusal) are CPU µs.
func FloodShare(perSale, perRefusal float64) float64 {
	r := max(perRefusal, 0)
	if perSale <= 4*r {
		return 0
	}
	return (perSale - 4*r) / (perSale - r)
}

// GoodputBound is the least goodput at 4× (Round.Goodput) a row must keep:
// 0.9 of FloodShare with the CPU a bare server spends per refusal, so the
// bar follows what the machine allows instead of a fixed share.
func GoodputBound(perSale, bareRefusal float64) float64 {
	return 0.9 * FloodShare(perSale, bareRefusal)
}

// Ceiling is what one client buying in a loop measured for a row: the
// window in which the key is not free for others, and 1 / that window.
type Ceiling struct {
	Window           string  `json:"window"`
	SerializedMicros float64 `json:"serialized_us_median"`
	CeilingPerSec    float64 `json:"ceiling_per_sec"`
}

// clear reports whether step s held with room to spare: no answer but
// 201, and a p99 within half the SLO. Near neither bound, it needs no
// second try.
func (c Options) clear(s Step) bool {
	return s.WithinSLO && s.ErrorRate == 0 && s.P99 <= float64(c.SLO)/float64(time.Millisecond)/2
}

// Settle is the try of a step that Search runs at the last rate held, right
// after a step that broke and before the next one it judges: judged by
// nothing, it lets the service recover from the break first.
const Settle = -1

// Search raises the rate step by step until a step breaks the SLO or the
// error budget, then narrows the gap between the last rate held and the
// first broken one by c.Refine geometric halvings, so that the rate held
// is known to within Factor^(1/2^Refine) (1.06 with the defaults) rather
// than to a whole step. offer runs one step. A rate holds if two of its
// tries hold before two break (three at most), or if its first try holds
// with room to spare (clear): on a shared machine one stall of a
// neighbour can break a step that the service holds, and one quiet moment
// can pass a step that it does not, and either, taken alone, moves the
// rate held by a step from run to run. And a step that follows a broken
// one comes after a Settle step at the last rate held: a break leaves the
// service throttled for a while (its admission limit falls with the
// latency it saw), and the step right after it would measure that
// recovery, not its own rate.
func Search(ctx context.Context, c Options, offer func(rate float64, try int) Step) (steps []Step, held float64) {
	afterBreak := false
	run := func(rate float64, try int) Step {
		if afterBreak && held > 0 {
			steps = append(steps, offer(held, Settle))
		}
		r := offer(rate, try)
		steps = append(steps, r)
		afterBreak = !r.WithinSLO
		return r
	}
	holds := func(rate float64) bool {
		within, broke := 0, 0
		for try := 0; within < 2 && broke < 2; try++ {
			r := run(rate, try)
			switch {
			case ctx.Err() != nil:
				return r.WithinSLO
			case try == 0 && c.clear(r):
				return true
			case r.WithinSLO:
				within++
			default:
				broke++
			}
		}
		return within == 2
	}
	broken := 0.0
	for rate := c.Start; rate <= c.Max && ctx.Err() == nil; rate *= c.Factor {
		if !holds(rate) {
			broken = rate
			break
		}
		held = rate
	}
	if held == 0 || broken == 0 {
		return steps, held
	}
	for range c.Refine {
		if ctx.Err() != nil {
			break
		}
		if mid := math.Sqrt(held * broken); holds(mid) {
			held = mid
		} else {
			broken = mid
		}
	}
	return steps, held
}
