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
)

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
