package idem

import (
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/problem"
)

// TestPanicAfterWriteIsNotRunAgain: a handler that moved the money, sent
// its answer and then panicked (or aborted with http.ErrAbortHandler) may
// have changed state, like any other 500: a retry with the same key must
// not run it again.
func TestPanicAfterWriteIsNotRunAgain(t *testing.T) {
	for name, panicWith := range map[string]any{"panic after answer": "boom", "abort": http.ErrAbortHandler} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, Options{})
			f.handler = func(c *gin.Context) {
				f.calls.Add(1) // the deposit landed
				c.JSON(http.StatusCreated, gin.H{"done": true})
				panic(panicWith)
			}
			key := uuid()
			for range 2 {
				func() {
					defer func() { _ = recover() }() // ErrAbortHandler reaches the server
					f.do("POST", optional, 1, key, `{"amount":100}`)
				}()
			}
			if n := f.calls.Load(); n != 1 {
				t.Fatalf("the handler ran %d times with one key", n)
			}
		})
	}
}

// TestFingerprintCaseFoldedDuplicates: encoding/json matches member names
// to struct fields without regard to case, the last match winning, so
// {"amount":100,"AMOUNT":500} deposits 500 and {"AMOUNT":500,"amount":100}
// deposits 100. The two must not share a fingerprint, or the second is
// answered with the first's outcome.
func TestFingerprintCaseFoldedDuplicates(t *testing.T) {
	f := newFixture(t, Options{})
	f.handler = func(c *gin.Context) {
		var in struct {
			Amount int64 `json:"amount"`
		}
		if err := problem.DecodeJSON(c, &in); err != nil {
			problem.Write(c, err)
			return
		}
		f.calls.Add(1)
		c.JSON(http.StatusOK, gin.H{"deposited": in.Amount})
	}
	key := uuid()
	want(t, f.do("POST", optional, 1, key, `{"amount":100,"AMOUNT":500}`), http.StatusOK, `"deposited":500`)
	second := f.do("POST", optional, 1, key, `{"AMOUNT":500,"amount":100}`)
	if second.Header().Get(ReplayedHeader) == "true" {
		t.Fatalf("a request meaning a deposit of 100 was answered with the replay %s", second.Body)
	}
}

// TestRecordExpiringMidRunKeepsKeyInUse: a client's key whose record
// reaches its TTL while a request with it still runs (a retry near the end
// of the day, a handler waiting for its locks) is still in use: a
// duplicate must get 409, not run the handler alongside the first.
func TestRecordExpiringMidRunKeepsKeyInUse(t *testing.T) {
	const ttl = 300 * time.Millisecond
	f := newFixture(t, Options{TTL: ttl})
	entered, finish := make(chan struct{}), make(chan struct{})
	var running atomic.Int64
	f.handler = func(c *gin.Context) {
		if running.Add(1) == 1 {
			close(entered)
			<-finish
		}
		defer running.Add(-1)
		f.calls.Add(1)
		c.JSON(http.StatusOK, gin.H{"done": true})
	}
	key := uuid()
	done := make(chan struct{})
	go func() { defer close(done); f.do("POST", optional, 1, key, `{"amount":100}`) }()
	<-entered
	time.Sleep(2 * ttl)
	w := f.do("POST", optional, 1, key, `{"amount":100}`)
	close(finish)
	<-done
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("the handler ran %d times with one key at once; the duplicate got %d %s", n, w.Code, w.Body)
	}
	want(t, w, http.StatusConflict, "idempotency-key-in-use")
}
