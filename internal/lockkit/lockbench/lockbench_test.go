package lockbench

import (
	"testing"
	"time"
)

func TestJain(t *testing.T) {
	for _, tc := range []struct {
		name   string
		counts []int
		want   float64
	}{
		{"even", []int{5, 5, 5, 5}, 1},
		{"one-takes-all", []int{20, 0, 0, 0}, 0.25},
		{"half", []int{10, 10, 0, 0}, 0.5},
	} {
		if got := Jain(tc.counts); got != tc.want {
			t.Errorf("%s: Jain(%v) = %v, want %v", tc.name, tc.counts, got, tc.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	var xs []time.Duration
	for i := 1; i <= 100; i++ {
		xs = append(xs, time.Duration(i))
	}
	if p := Percentile(xs, 0.99); p != 99 {
		t.Errorf("p99 of 1..100 = %v, want 99", p)
	}
	if p := Percentile(xs, 0.5); p != 50 {
		t.Errorf("p50 of 1..100 = %v, want 50", p)
	}
	if p := Percentile(nil, 0.5); p != 0 {
		t.Errorf("p50 of nothing = %v", p)
	}
}
