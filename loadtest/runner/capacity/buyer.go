package capacity

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Buyer sends purchases of one SKU, round-robin over the instances and
// over the users' tokens.
type Buyer struct {
	urls   []string
	tokens []string
	sku    string
	client *http.Client
}

// NewBuyer buys sku on the instances at urls, as the users whose bearer
// tokens are given.
func NewBuyer(urls, tokens []string, sku string) *Buyer {
	return &Buyer{urls: urls, tokens: tokens, sku: sku, client: &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 1024, MaxIdleConns: 4096, IdleConnTimeout: time.Minute},
	}}
}

// answer is one purchase's outcome.
type answer struct {
	status int
	took   time.Duration
	err    string
}

// Offer sends rate purchases per second for d, open loop: each request
// leaves at its scheduled time whether or not earlier ones have answered,
// and its latency counts from that time, so a slow server cannot slow the
// clock that measures it (no coordinated omission).
func (b *Buyer) Offer(ctx context.Context, rate float64, d, slo time.Duration, maxErrors float64) Step {
	n := int(math.Round(rate * d.Seconds()))
	interval := time.Duration(float64(time.Second) / rate)
	answers := make([]answer, n)
	var wg sync.WaitGroup
	start := time.Now()
	for i := range n {
		at := start.Add(time.Duration(i) * interval)
		if !sleepUntil(ctx, at) {
			n = i
			break
		}
		wg.Go(func() {
			status, err := b.purchase(ctx, i)
			answers[i] = answer{status: status, took: time.Since(at)}
			if err != nil {
				answers[i].err = err.Error()
			}
		})
	}
	wg.Wait()
	s := summarize(answers[:n], time.Since(start), slo, maxErrors)
	s.Rate = rate
	return s
}

// sleepUntil waits for t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	if wait := time.Until(t); wait > 0 {
		select {
		case <-time.After(wait):
		case <-ctx.Done():
		}
	}
	return ctx.Err() == nil
}

// summarize counts a step's answers: 201 sold, 503 turned away (busy),
// anything else an error; the latencies are the sales'.
func summarize(answers []answer, elapsed, slo time.Duration, maxErrors float64) Step {
	r := Step{Offered: len(answers)}
	var sold []time.Duration
	for _, a := range answers {
		switch a.status {
		case http.StatusCreated:
			r.Sold++
			sold = append(sold, a.took)
		case http.StatusServiceUnavailable:
			r.Busy++
		default:
			r.Other++
			if r.FirstError == "" {
				r.FirstError = fmt.Sprintf("status %d %s", a.status, a.err)
			}
		}
	}
	slices.Sort(sold)
	r.P50, r.P99 = msOf(pct(sold, 0.50)), msOf(pct(sold, 0.99))
	if len(answers) > 0 {
		r.ErrorRate = float64(r.Busy+r.Other) / float64(len(answers))
	}
	r.Seconds = elapsed.Seconds()
	r.SalesPerS = float64(r.Sold) / r.Seconds
	r.WithinSLO = r.Sold > 0 && r.P99 <= msOf(slo) && r.ErrorRate <= maxErrors
	return r
}

func (b *Buyer) purchase(ctx context.Context, i int) (int, error) {
	url := b.urls[i%len(b.urls)] + "/api/v1/seckill/" + b.sku + "/purchase"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(`{"quantity":1}`))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+b.tokens[i%len(b.tokens)])
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, err
	}
	var body bytes.Buffer
	_, _ = body.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusServiceUnavailable {
		return resp.StatusCode, fmt.Errorf("%s", tail(body.Bytes()))
	}
	return resp.StatusCode, nil
}

// pct is the p-th quantile of sorted, by the nearest-rank method.
func pct(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

func msOf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// tail is the end of a response body, enough to say what went wrong.
func tail(b []byte) string {
	const n = 2000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}
