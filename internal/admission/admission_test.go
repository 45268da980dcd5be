package admission

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/optimistic"
)

// limitAfter serves one window of requests, one after another, on a route
// whose handler fails each with err, answered 503, and returns the route's
// limit. The first window is its own long-run mean, so its latency alone
// cannot move the limit, whatever the clock says.
func limitAfter(t *testing.T, err error) int {
	t.Helper()
	gin.SetMode(gin.TestMode)
	a := New(Options{Target: time.Hour, Initial: 32, Min: 2, Max: 1024, Window: 20}, prometheus.NewRegistry())
	r := gin.New()
	r.Use(a.Handler())
	r.POST("/buy", func(c *gin.Context) {
		_ = c.Error(err)
		c.AbortWithStatus(http.StatusServiceUnavailable)
	})
	for range 20 {
		r.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodPost, "/buy", nil))
	}
	return a.limiter("/buy").Limit()
}

func TestALostOptimisticRaceLowersTheLimit(t *testing.T) {
	lost := fmt.Errorf("purchase: %w", optimistic.ErrConflict)
	if got := limitAfter(t, lost); got >= 32 {
		t.Fatalf("limit %d after a window of lost races, want under 32", got)
	}
}

func TestALockThatStayedBusyDoesNotLowerTheLimit(t *testing.T) {
	busy := errors.New("lock busy")
	if got := limitAfter(t, busy); got != 32 {
		t.Fatalf("limit %d after a window of lock-busy answers, want 32: only latency may lower it", got)
	}
}
