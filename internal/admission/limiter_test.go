package admission

import (
	"testing"
	"time"
)

var testOptions = Options{Target: 50 * time.Millisecond, Initial: 32, Min: 4, Max: 1024, Window: 20}

// saturate runs windows of requests that fill the limit, each taking rtt,
// and returns the limit after each window.
func saturate(l *Limiter, windows int, rtt time.Duration) []int {
	var limits []int
	for range windows {
		closed := false
		for !closed {
			n := 0
			for l.Acquire() {
				n++
			}
			for range n {
				closed = l.Release(rtt, false) || closed
			}
		}
		limits = append(limits, l.Limit())
	}
	return limits
}

func TestAdmitsUpToTheLimitAndRefusesTheRest(t *testing.T) {
	l := NewLimiter(testOptions)
	for i := range 32 {
		if !l.Acquire() {
			t.Fatalf("request %d refused under a limit of 32", i+1)
		}
	}
	if l.Acquire() {
		t.Fatal("33rd request admitted under a limit of 32")
	}
	l.Release(time.Millisecond, false)
	if !l.Acquire() {
		t.Fatal("a request refused after one in flight ended")
	}
}

func TestLatencyRiseLowersTheLimit(t *testing.T) {
	l := NewLimiter(testOptions)
	saturate(l, 20, 5*time.Millisecond) // the long-run mean learns 5 ms
	before := l.Limit()
	got := saturate(l, 5, 40*time.Millisecond) // 8x slower, still under Target
	for i, lim := range got {
		if prev := append([]int{before}, got...)[i]; lim >= prev {
			t.Fatalf("limit did not fall while latency was 8x its mean: %d, then %v", before, got)
		}
	}
	if got[len(got)-1] >= before/2 {
		t.Fatalf("limit %d after 5 slow windows, from %d: want under half", got[len(got)-1], before)
	}
}

func TestLatencyPastTargetLowersTheLimitToTheMinimum(t *testing.T) {
	l := NewLimiter(testOptions)
	got := saturate(l, 40, 400*time.Millisecond) // steady, but 8x Target
	if last := got[len(got)-1]; last != testOptions.Min {
		t.Fatalf("limit %d after 40 windows at 8x Target, want the minimum %d: %v", last, testOptions.Min, got)
	}
}

func TestRecoveryRaisesTheLimit(t *testing.T) {
	l := NewLimiter(testOptions)
	saturate(l, 20, 5*time.Millisecond)
	low := saturate(l, 20, 200*time.Millisecond)
	floor := low[len(low)-1]
	got := saturate(l, 30, 5*time.Millisecond)
	for i := 1; i < len(got); i++ {
		if got[i] < got[i-1] {
			t.Fatalf("limit fell while latency was back to its mean: %v", got)
		}
	}
	if got[len(got)-1] < 4*floor {
		t.Fatalf("limit %d after 30 fast windows, from %d: want at least 4x", got[len(got)-1], floor)
	}
}

func TestLimitDoesNotGrowPastWhatWasUsed(t *testing.T) {
	l := NewLimiter(testOptions)
	for range 100 { // one request at a time: the limit is never tested
		l.Acquire()
		l.Release(time.Millisecond, false)
	}
	if got := l.Limit(); got > testOptions.Initial {
		t.Fatalf("limit %d after only one request in flight at a time, want at most %d", got, testOptions.Initial)
	}
}

func TestLimitStaysWithinMax(t *testing.T) {
	o := testOptions
	o.Max = 40
	l := NewLimiter(o)
	if got := saturate(l, 50, time.Millisecond); got[len(got)-1] != 40 {
		t.Fatalf("limit %d after 50 fast windows, want the maximum 40", got[len(got)-1])
	}
}

func TestRequestsDroppedAfterWorkLowerTheLimitHoweverFast(t *testing.T) {
	l := NewLimiter(testOptions)
	saturate(l, 20, 5*time.Millisecond)
	before := l.Limit()
	for i := range 10 * testOptions.Window { // as fast as ever, but one in 20 lost its race
		l.Acquire()
		l.Release(5*time.Millisecond, i%20 == 0)
	}
	if got := l.Limit(); got >= before/2 {
		t.Fatalf("limit %d after 10 windows with drops, from %d: want under half", got, before)
	}
}
