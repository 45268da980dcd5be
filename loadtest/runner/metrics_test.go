package main

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
)

// metricsServer serves text on /metrics, as an instance does.
func metricsServer(t *testing.T, text string) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, text)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func TestSumSamplesReadsOneMetricWithItsLabels(t *testing.T) {
	lines := []string{
		"# HELP shop_events_published_total Order events the broker acknowledged.",
		"# TYPE shop_events_published_total counter",
		`shop_events_published_total{result="duplicate"} 3`,
		`shop_events_published_total{result="stored"} 120`,
		"shop_events_published_totalx 99",
		"shop_events_backlog 7",
	}
	if got := sumSamples(lines, "shop_events_published_total", ""); got != 123 {
		t.Errorf("all samples: %g, want 123", got)
	}
	if got := sumSamples(lines, "shop_events_published_total", `result="duplicate"`); got != 3 {
		t.Errorf("duplicates: %g, want 3", got)
	}
	if got := sumSamples(lines, "shop_events_backlog", ""); got != 7 {
		t.Errorf("backlog: %g, want 7", got)
	}
}

func TestScrapeSumReadsAnInstancesMetrics(t *testing.T) {
	url := metricsServer(t, "# TYPE shop_events_published_total counter\n"+
		`shop_events_published_total{result="stored"} 40`+"\n"+`shop_events_published_total{result="duplicate"} 2`+"\n")
	if got, err := scrapeSum(context.Background(), url, "shop_events_published_total", ""); err != nil || got != 42 {
		t.Errorf("published %g (%v), want 42", got, err)
	}
}

// The optimistic row's retries are counted on the stock alone, over every
// instance: the balance's retries are another flow's.
func TestRetriesPerRequestSumsTheStocksCountersOfEveryInstance(t *testing.T) {
	one := metricsServer(t, `shop_optimistic_attempts_total{domain="stock"} 30
shop_optimistic_requests_total{domain="stock"} 20
shop_optimistic_attempts_total{domain="balance"} 900
shop_optimistic_requests_total{domain="balance"} 100
`)
	two := metricsServer(t, `shop_optimistic_attempts_total{domain="stock"} 10
shop_optimistic_requests_total{domain="stock"} 5
`)
	got, err := retriesPerRequest(context.Background(), []string{one, two})
	if err != nil || got != 0.6 { // (40 - 25) / 25
		t.Errorf("retries per request %g (%v), want 0.6", got, err)
	}
}

func TestRetriesPerRequestWithoutRequestsIsZero(t *testing.T) {
	url := metricsServer(t, "shop_build_info 1\n")
	if got, err := retriesPerRequest(context.Background(), []string{url}); err != nil || got != 0 {
		t.Errorf("%g, %v; want 0", got, err)
	}
}

func TestRetriesPerRequestFromAnInstanceThatDoesNotAnswerIsAnError(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	if _, err := retriesPerRequest(context.Background(), []string{url}); err == nil {
		t.Error("a gone instance's counters were read")
	}
}
