package capacity

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func ms(n int) time.Duration { return time.Duration(n) * time.Millisecond }

// A step's verdict comes from its answers: sales and their p99 against the
// SLO, and every answer that is not a sale against the error budget.
func TestSummarizeCountsSalesBusyAndErrors(t *testing.T) {
	var answers []answer
	for i := 1; i <= 97; i++ {
		answers = append(answers, answer{status: http.StatusCreated, took: ms(i)})
	}
	answers = append(answers,
		answer{status: http.StatusServiceUnavailable, took: ms(1)},
		answer{status: http.StatusServiceUnavailable, took: ms(1)},
		answer{status: http.StatusConflict, err: "sold out"})
	cases := []struct {
		name      string
		slo       time.Duration
		maxErrors float64
		within    bool
	}{
		{"within both", ms(97), 0.03, true},
		{"p99 past the SLO", ms(95), 0.03, false},
		{"errors past the budget", ms(97), 0.02, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := summarize(answers, 2*time.Second, c.slo, c.maxErrors)
			if s.Offered != 100 || s.Sold != 97 || s.Busy != 2 || s.Other != 1 {
				t.Fatalf("offered %d sold %d busy %d other %d, want 100 97 2 1", s.Offered, s.Sold, s.Busy, s.Other)
			}
			if s.P50 != 49 || s.P99 != 97 || s.SalesPerS != 48.5 || s.ErrorRate != 0.03 {
				t.Errorf("p50 %.0f p99 %.0f sales/s %.1f errors %.2f, want 49 97 48.5 0.03", s.P50, s.P99, s.SalesPerS, s.ErrorRate)
			}
			if s.FirstError != "status 409 sold out" {
				t.Errorf("first error %q", s.FirstError)
			}
			if s.WithinSLO != c.within {
				t.Errorf("within SLO %v, want %v", s.WithinSLO, c.within)
			}
		})
	}
}

// A step that sold nothing holds nothing, however fast its errors were.
func TestSummarizeWithoutSalesIsNotWithinTheSLO(t *testing.T) {
	s := summarize([]answer{{status: http.StatusServiceUnavailable}}, time.Second, time.Second, 1)
	if s.WithinSLO {
		t.Error("a step with no sale held")
	}
}

// Offer sends the rate's purchases, round-robin over the instances and the
// users, and counts the service's answers.
func TestOfferSendsEveryPurchaseAndCountsTheAnswers(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/api/v1/seckill/hot/purchase" || r.Header.Get("Authorization") == "" {
			http.Error(w, "wrong request", http.StatusBadRequest)
			return
		}
		if calls.Add(1)%4 == 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	b := NewBuyer([]string{srv.URL, srv.URL}, []string{"a", "b", "c"}, "hot")
	s := b.Offer(context.Background(), 40, time.Second, time.Minute, 0.5)
	if s.Offered != 40 || s.Sold != 30 || s.Busy != 10 || s.Other != 0 || !s.WithinSLO || s.Rate != 40 {
		t.Errorf("%+v, want 40 offered, 30 sold, 10 busy, within the SLO", s)
	}
}
