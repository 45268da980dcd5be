package idem

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/problem"
)

// TestCrashedRunExpires: a process that claimed a key and died blocks it
// for one lease; then a retry runs, and the dead run, should it wake up,
// can neither store its response nor free the key.
func TestCrashedRunExpires(t *testing.T) {
	f := newFixture(t, Options{Lease: 300 * time.Millisecond})
	ctx := context.Background()
	key, body := uuid(), `{"a":1}`
	fp := fingerprint("POST", optional, "", 1, []byte(body))
	v, crashedRun, _, err := f.idem.claim(ctx, 1, key, fp, false)
	if err != nil || v != runIt {
		t.Fatalf("claim: %v %v", v, err)
	}
	want(t, f.do("POST", optional, 1, key, body), http.StatusConflict, "idempotency-key-in-use")
	deadline := time.Now().Add(2 * time.Second)
	w := f.do("POST", optional, 1, key, body)
	for w.Code == http.StatusConflict && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		w = f.do("POST", optional, 1, key, body)
	}
	want(t, w, http.StatusCreated, `"call":1`)

	rec, lease := f.idem.keys(1, key)
	if n, err := storeScript.Run(ctx, f.client, []string{rec, lease}, crashedRun, fp, 500, "{}", "stale", "x").Int(); err != nil || n != 0 {
		t.Fatalf("the crashed run stored its response: %d %v", n, err)
	}
	if n, err := releaseScript.Run(ctx, f.client, []string{rec, lease}, crashedRun).Int(); err != nil || n != 0 {
		t.Fatalf("the crashed run freed the key: %d %v", n, err)
	}
	wantReplay(t, w, f.do("POST", optional, 1, key, body))
}

// TestLeaseRenewedWhileRunning: a request that runs for several leases
// keeps its key; a duplicate meanwhile is 409, and the handler is not
// cancelled.
func TestLeaseRenewedWhileRunning(t *testing.T) {
	// Generous against a loaded machine: a renewal is due every 200 ms and
	// may be 400 ms late before a duplicate could take over.
	f := newFixture(t, Options{Lease: 600 * time.Millisecond})
	entered := make(chan struct{})
	f.handler = func(c *gin.Context) {
		close(entered)
		select {
		case <-time.After(2 * time.Second):
			c.JSON(http.StatusOK, gin.H{"done": true})
		case <-c.Request.Context().Done():
			problem.Write(c, context.Cause(c.Request.Context()))
		}
	}
	key := uuid()
	done := make(chan int)
	go func() { done <- f.do("POST", optional, 1, key, `{}`).Code }()
	<-entered
	time.Sleep(1200 * time.Millisecond) // two leases
	want(t, f.do("POST", optional, 1, key, `{}`), http.StatusConflict, "idempotency-key-in-use")
	if code := <-done; code != http.StatusOK {
		t.Fatalf("the long request answered %d", code)
	}
}

// TestLeaseLostCancelsHandler: once another run has claimed the key, the
// running handler's context ends with lockkit.ErrLeaseLost.
func TestLeaseLostCancelsHandler(t *testing.T) {
	f := newFixture(t, Options{Lease: 300 * time.Millisecond})
	entered, cause := make(chan struct{}), make(chan error, 1)
	f.handler = func(c *gin.Context) {
		close(entered)
		select {
		case <-time.After(3 * time.Second):
			cause <- nil
		case <-c.Request.Context().Done():
			cause <- context.Cause(c.Request.Context())
		}
		problem.Write(c, lockkit.ErrLeaseLost)
	}
	key := uuid()
	done := make(chan struct{})
	go func() { defer close(done); f.do("POST", optional, 1, key, `{}`) }()
	<-entered
	rec, _ := f.idem.keys(1, key)
	if err := f.client.HIncrBy(context.Background(), rec, "run", 1).Err(); err != nil { // as a later claim does
		t.Fatal(err)
	}
	if err := <-cause; !errors.Is(err, lockkit.ErrLeaseLost) {
		t.Fatalf("handler context ended with %v, want ErrLeaseLost", err)
	}
	<-done
}

// TestSlowHandlerIsStored: a handler that runs longer than the time the
// writes after it may take (a lock wait of 10 s, say) still has its
// answer stored, so a retry does not run it again.
func TestSlowHandlerIsStored(t *testing.T) {
	saved := finishTimeout
	finishTimeout = 200 * time.Millisecond
	t.Cleanup(func() { finishTimeout = saved })
	f := newFixture(t, Options{})
	inner := f.handler
	f.handler = func(c *gin.Context) {
		time.Sleep(2 * finishTimeout)
		inner(c)
	}
	key := uuid()
	first := f.do("POST", optional, 1, key, `{"a":1}`)
	want(t, first, http.StatusCreated, `"call":1`)
	wantReplay(t, first, f.do("POST", optional, 1, key, `{"a":1}`))
}
