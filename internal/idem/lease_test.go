package idem

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

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
	fp := fingerprint("POST", "/api/v1/accounts/:id/x\x00id=1", "", 1, []byte(body)) // optional's route and id
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

// renewFaults delays or fails the renewals of the key's lease, on a real
// connection: every other call passes untouched.
type renewFaults struct {
	delay atomic.Int64 // ns before a renewal is sent
	fail  atomic.Bool
	done  atomic.Int64 // renewals that reached Redis
}

func (h *renewFaults) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *renewFaults) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *renewFaults) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) < 2 || !strings.HasPrefix(cmd.Name(), "eval") ||
			(args[1] != renewScript.Hash() && args[1] != renewLua) {
			return next(ctx, cmd)
		}
		if h.fail.Load() {
			err := errors.New("renewal refused by the test")
			cmd.SetErr(err)
			return err
		}
		time.Sleep(time.Duration(h.delay.Load()))
		defer h.done.Add(1)
		return next(ctx, cmd)
	}
}

// TestLeaseLostBeforeAnotherRunCanClaim: a request whose renewals fail
// must see its context end by the time its lease in Redis has run out,
// not a renewal tick later: from that moment a duplicate may claim the key
// and run the handler too. A last renewal that left late (a loaded
// process) and failures that come back at once (READONLY after a
// failover, a refused connection) put the lost check a tick behind.
func TestLeaseLostBeforeAnotherRunCanClaim(t *testing.T) {
	const lease = 900 * time.Millisecond
	f := newFixture(t, Options{Lease: lease})
	faults := &renewFaults{}
	f.client.AddHook(faults)
	entered := make(chan struct{})
	var firstCtx atomic.Pointer[context.Context]
	var overlapped atomic.Bool
	f.handler = func(c *gin.Context) {
		ctx := c.Request.Context()
		if firstCtx.CompareAndSwap(nil, &ctx) {
			close(entered)
			<-ctx.Done()
			c.Status(http.StatusServiceUnavailable)
			return
		}
		overlapped.Store((*firstCtx.Load()).Err() == nil)
		c.JSON(http.StatusOK, gin.H{"second": true})
	}
	key := uuid()
	done := make(chan struct{})
	go func() { defer close(done); f.do("POST", optional, 1, key, `{}`) }()
	<-entered
	faults.delay.Store(int64(lease / 6))
	for faults.done.Load() == 0 {
		time.Sleep(5 * time.Millisecond)
	}
	faults.fail.Store(true)
	deadline := time.Now().Add(3 * lease)
	for time.Now().Before(deadline) {
		if w := f.do("POST", optional, 1, key, `{}`); w.Code != http.StatusConflict {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	<-done
	if overlapped.Load() {
		t.Fatal("a duplicate claimed the key and ran while the first request's context was still live")
	}
}
