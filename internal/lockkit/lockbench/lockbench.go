// Package lockbench measures locks the same way whatever their library:
// uncontended acquire+release cycles, and a contended run where goroutines
// loop acquire / critical section / release on one key, reporting
// throughput, the wait before each grant, give-ups and fairness.
package lockbench

import (
	"context"
	"math"
	"slices"
	"sync"
	"time"
)

// Acquirer takes key and returns the function that releases it. Each peer
// library is adapted to this one shape so that all are timed alike.
type Acquirer func(ctx context.Context, key string) (release func() error, err error)

// Contention describes a contended run.
type Contention struct {
	Goroutines      int
	CriticalSection time.Duration
	Duration        time.Duration
	// GiveUp bounds one wait; a wait that runs out counts as a give-up.
	GiveUp time.Duration
}

// Result of a contended run.
type Result struct {
	Cycles         int
	GaveUp         int
	Errors         int
	CyclesPerSec   float64
	P50, P99, Max  time.Duration
	Fairness       float64 // Jain's index over per-goroutine grant counts: 1 = perfectly even
	PerGoroutine   []int
	IdealP99       time.Duration // (N-1) x (critical section + 2 round trips)
	RoundTripUsed  time.Duration
	CriticalActual time.Duration
	// HandOffP50 and HandOffP99 are the gaps from one holder's release
	// call to the next holder's Acquire returning: what the lock itself
	// takes from every cycle, the critical section's own time left out.
	HandOffP50, HandOffP99 time.Duration
}

// hold is one grant as the waiter saw it: Acquire returned at from, the
// release was called at to.
type hold struct{ from, to time.Time }

// Contend runs c against the acquirers (goroutine i uses acquirers[i %
// len]) on one key. roundTrip is the server's raw round trip measured in
// the same run, for the ideal-queue figure.
func Contend(ctx context.Context, acquirers []Acquirer, key string, c Contention, roundTrip time.Duration) Result {
	var (
		mu     sync.Mutex
		waits  []time.Duration
		counts = make([]int, c.Goroutines)
		holds  []hold
		gaveUp int
		errs   int
		wg     sync.WaitGroup
		start  = make(chan struct{})
	)
	deadline := time.Now().Add(c.Duration)
	for g := range c.Goroutines {
		acquire := acquirers[g%len(acquirers)]
		wg.Go(func() {
			<-start
			for time.Now().Before(deadline) {
				waitCtx, cancel := context.WithTimeout(ctx, c.GiveUp)
				t0 := time.Now()
				release, err := acquire(waitCtx, key)
				wait := time.Since(t0)
				cancel()
				if err != nil {
					mu.Lock()
					if waitCtx.Err() != nil || wait >= c.GiveUp {
						gaveUp++
					} else {
						errs++
					}
					mu.Unlock()
					continue
				}
				from := time.Now()
				criticalSection(c.CriticalSection)
				to := time.Now()
				if err := release(); err != nil {
					mu.Lock()
					errs++
					mu.Unlock()
				}
				mu.Lock()
				waits = append(waits, wait)
				holds = append(holds, hold{from, to})
				counts[g]++
				mu.Unlock()
			}
		})
	}
	begin := time.Now()
	close(start)
	wg.Wait()
	elapsed := time.Since(begin)

	slices.Sort(waits)
	r := Result{
		Cycles: len(waits), GaveUp: gaveUp, Errors: errs,
		CyclesPerSec:  float64(len(waits)) / elapsed.Seconds(),
		P50:           Percentile(waits, 0.50),
		P99:           Percentile(waits, 0.99),
		Fairness:      Jain(counts),
		PerGoroutine:  counts,
		RoundTripUsed: roundTrip,
	}
	if len(waits) > 0 {
		r.Max = waits[len(waits)-1]
	}
	r.HandOffP50, r.HandOffP99 = handOffs(holds)
	r.CriticalActual = measureSleep(c.CriticalSection)
	r.IdealP99 = time.Duration(c.Goroutines-1) * (r.CriticalActual + 2*roundTrip)
	return r
}

// Percentile of sorted durations, nearest rank.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// Jain is Jain's fairness index of xs: (sum x)^2 / (n * sum x^2), 1 when
// every goroutine got the same number of grants, 1/n when one got all.
func Jain(xs []int) float64 {
	var sum, squares float64
	for _, x := range xs {
		sum += float64(x)
		squares += float64(x) * float64(x)
	}
	if squares == 0 {
		return 0
	}
	return sum * sum / (float64(len(xs)) * squares)
}

// handOffs returns the median and p99 gap between one hold's release call
// and the next hold's start.
func handOffs(holds []hold) (p50, p99 time.Duration) {
	if len(holds) < 2 {
		return 0, 0
	}
	slices.SortFunc(holds, func(a, b hold) int { return a.from.Compare(b.from) })
	gaps := make([]time.Duration, 0, len(holds)-1)
	for i := 1; i < len(holds); i++ {
		gaps = append(gaps, holds[i].from.Sub(holds[i-1].to))
	}
	slices.Sort(gaps)
	return Percentile(gaps, 0.50), Percentile(gaps, 0.99)
}

// measureSleep returns what a critical section of d really takes here: on
// a loaded machine it is longer, and the ideal queue must use what is real.
func measureSleep(d time.Duration) time.Duration {
	const n = 50
	t0 := time.Now()
	for range n {
		criticalSection(d)
	}
	return time.Since(t0) / n
}
