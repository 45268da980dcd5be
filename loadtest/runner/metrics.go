package main

import (
	"bufio"
	"context"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// scrape reads the lines of url's /metrics.
func scrape(ctx context.Context, url string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var lines []string
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	return lines, sc.Err()
}

// scrapeSum is the sum of the samples of metric on url's /metrics whose
// labels contain label ("" matches every sample).
func scrapeSum(ctx context.Context, url, metric, label string) (float64, error) {
	lines, err := scrape(ctx, url)
	return sumSamples(lines, metric, label), err
}

// sumSamples adds the Prometheus text-format samples of metric (exactly
// that name, with or without labels) whose labels contain label.
func sumSamples(lines []string, metric, label string) float64 {
	var sum float64
	for _, line := range lines {
		end := strings.IndexAny(line, "{ ")
		if end < 0 || line[:end] != metric {
			continue
		}
		labels := ""
		if line[end] == '{' {
			labels = line[end : strings.LastIndex(line, "}")+1]
		}
		if !strings.Contains(labels, label) {
			continue
		}
		f := strings.Fields(line) // the value is last: client_golang writes no timestamps
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			sum += v
		}
	}
	return sum
}

// retriesPerRequest sums the optimistic counters on the stock of every
// instance's /metrics: extra attempts per request that ended.
func retriesPerRequest(ctx context.Context, urls []string) (float64, error) {
	const stock = `domain="stock"`
	var attempts, requests float64
	for _, u := range urls {
		lines, err := scrape(ctx, u)
		if err != nil {
			return 0, err
		}
		attempts += sumSamples(lines, "shop_optimistic_attempts_total", stock)
		requests += sumSamples(lines, "shop_optimistic_requests_total", stock)
	}
	if requests == 0 {
		return 0, nil
	}
	return (attempts - requests) / requests, nil
}
