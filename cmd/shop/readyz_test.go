package main

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/gin-gonic/gin"
)

// TestReadinessChecksInParallel: the database and redis checks here each
// answer only once the other has started, which only a parallel readiness
// can satisfy; the lock backend never answers, and is named as timed out
// within the one budget instead of holding the answer past the probe's
// timeout.
func TestReadinessChecksInParallel(t *testing.T) {
	hung := make(chan struct{})
	defer close(hung)
	down := readinessApp(hung).readiness(context.Background())
	if len(down) != 1 || !errors.Is(down["lock backend zookeeper"], errReadyTimeout) {
		t.Errorf("down = %v; want only the lock backend, timed out", down)
	}

	r := gin.New()
	r.GET("/readyz", readyz(readinessApp(hung).readiness, nil))
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "lock backend zookeeper (timed out)") {
		t.Errorf("/readyz: %d %s; want 503 naming the lock backend as timed out", rec.Code, rec.Body)
	}
}

// readinessApp's checks can be asked once.
func readinessApp(hung <-chan struct{}) *app {
	var started sync.WaitGroup
	started.Add(2)
	together := func(ctx context.Context) error {
		started.Done()
		done := make(chan struct{})
		go func() { started.Wait(); close(done) }()
		select {
		case <-done:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return &app{ready: []readyCheck{
		{"database", together},
		{"redis", together},
		{"lock backend zookeeper", func(context.Context) error { <-hung; return nil }},
	}}
}
