package admission

import (
	"math"
	"sync"
	"time"
)

// Options are a limiter's bounds and the latency it steers by.
type Options struct {
	// Target is the mean latency a window of requests may reach before the
	// limit falls: a share of the SLO, so that queueing stays well inside it.
	Target time.Duration
	// Initial, Min and Max bound the limit. Min stays above 1: a limit of 1
	// would serialize the unlocked baseline and hide the races it must show.
	Initial, Min, Max int
	// Window is how many finished requests make one sample of latency.
	Window int
}

// Defaults are the options when SHOP_ADMISSION_* are unset.
var Defaults = Options{Target: 50 * time.Millisecond, Initial: 32, Min: 2, Max: 1024, Window: 20}

// Tuning of the gradient, as in Netflix concurrency-limits' Gradient2.
const (
	tolerance = 1.5  // a window may be this much slower than the long-run mean before the limit falls
	smoothing = 0.3  // share of each new estimate taken into the limit
	longDecay = 0.02 // weight of each window in the long-run mean (Gradient2 remembers ~600 requests)
	minGrad   = 0.5  // the limit at most halves per window (before smoothing)
)

// Limiter is an adaptive concurrency limit: it admits a request while
// fewer than its limit are in flight, and after every Window requests
// moves the limit by the gradient of their latency: down when they were
// slower than the long-run mean by more than the tolerance or slower than
// Target, up by the square root of the limit otherwise, so that it finds
// the concurrency the route serves without queueing. A window in which
// some admitted request was dropped (worked, then lost an optimistic race)
// lowers the limit however fast it was: those requests are work that sold
// nothing, and the way to fewer of them is fewer at once.
type Limiter struct {
	o Options

	mu       sync.Mutex
	limit    float64
	inFlight int
	long     float64 // long-run mean latency, seconds
	// The window being filled.
	n           int
	sum         float64 // seconds
	maxInFlight int
	dropped     bool
}

// NewLimiter returns a limiter at o.Initial.
func NewLimiter(o Options) *Limiter {
	return &Limiter{o: o, limit: float64(o.Initial)}
}

// Acquire admits a request if fewer than the limit are in flight. A
// request admitted must be followed by one Release.
func (l *Limiter) Acquire() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.inFlight >= int(l.limit) {
		return false
	}
	l.inFlight++
	l.maxInFlight = max(l.maxInFlight, l.inFlight)
	return true
}

// Release ends an admitted request that took rtt; dropped says it lost a
// race after it had started work. It reports whether the limit was
// recomputed (a window closed).
func (l *Limiter) Release(rtt time.Duration, dropped bool) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inFlight--
	l.n++
	l.sum += rtt.Seconds()
	l.dropped = l.dropped || dropped
	if l.n < l.o.Window {
		return false
	}
	l.update(l.sum/float64(l.n), l.maxInFlight, l.dropped)
	l.n, l.sum, l.maxInFlight, l.dropped = 0, 0, l.inFlight, false
	return true
}

// Limit is the current limit.
func (l *Limiter) Limit() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return int(l.limit)
}

// update moves the limit by one window whose mean latency was short.
func (l *Limiter) update(short float64, peak int, dropped bool) {
	if l.long == 0 {
		l.long = short
	}
	l.long = (1-longDecay)*l.long + longDecay*short
	// After a stretch of queueing the long-run mean lags high; let it fall
	// quickly so that it does not excuse the next one.
	if l.long > 2*short {
		l.long = 0.9*l.long + 0.1*short
	}
	grad := math.Min(1, tolerance*l.long/short)
	if target := l.o.Target.Seconds(); target > 0 && short > target {
		grad = math.Min(grad, target/short)
	}
	grad = math.Max(minGrad, grad)
	next := l.limit*grad + math.Sqrt(l.limit)
	if dropped {
		next = l.limit * minGrad
	}
	// A route that never filled half its limit has shown nothing about a
	// larger one: it may fall, not grow.
	if float64(peak) < l.limit/2 {
		next = math.Min(next, l.limit)
	}
	next = (1-smoothing)*l.limit + smoothing*next
	l.limit = math.Max(float64(l.o.Min), math.Min(float64(l.o.Max), next))
}
