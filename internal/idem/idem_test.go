package idem

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/testenv"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler)) // the panics and 503s below are meant
	goleak.VerifyTestMain(m)
}

const testSecret = "idem-test-secret-of-at-least-32-bytes!"

// fixture is a router with the middleware in front of a handler the test
// steers, on the real Redis.
type fixture struct {
	t       *testing.T
	idem    *Idem
	router  *gin.Engine
	auth    *auth.Auth
	client  redis.UniversalClient
	prefix  string
	calls   atomic.Int64
	handler func(c *gin.Context) // what POST /things does
}

func newFixture(t *testing.T, o Options) *fixture {
	client := redis.NewClient(&redis.Options{Addr: testenv.Require(t, "SHOP_TEST_REDIS_ADDR")})
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "idem_test:" + hex.EncodeToString(b) + ":"
	locker := redislock.New(client, redislock.WithPrefix(prefix))
	t.Cleanup(func() {
		ctx := context.Background()
		it := client.Scan(ctx, 0, prefix+"*", 500).Iterator()
		for it.Next(ctx) {
			client.Del(ctx, it.Val())
		}
		it = client.Scan(ctx, 0, "{"+prefix+"*", 500).Iterator()
		for it.Next(ctx) {
			client.Del(ctx, it.Val())
		}
		locker.Close()
		client.Close()
	})
	o.Locker, o.Prefix = locker, prefix
	m, err := New(client, o)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, idem: m, client: client, prefix: prefix, auth: auth.New([]byte(testSecret), "admin")}
	f.handler = func(c *gin.Context) {
		var body map[string]any
		if err := problem.DecodeJSON(c, &body); err != nil {
			problem.Write(c, err)
			return
		}
		n := f.calls.Add(1)
		c.Header("Location", "/things/1")
		c.JSON(http.StatusCreated, gin.H{"call": n, "got": body})
	}
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.Use(newRequestID, problem.Recover())
	api := r.Group("/api/v1", f.auth.User())
	m.Register(api)
	api.POST("/things", m.Middleware(), func(c *gin.Context) { f.handler(c) })
	f.router = r
	return f
}

// newRequestID stands in for cmd/shop's request id middleware: every
// exchange gets an id of its own.
func newRequestID(c *gin.Context) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	c.Header(problem.RequestIDHeader, hex.EncodeToString(b))
}

func (f *fixture) bearer(user int64) string {
	tok, err := f.auth.Token(user, time.Hour, time.Now())
	if err != nil {
		f.t.Fatal(err)
	}
	return "Bearer " + tok
}

func (f *fixture) do(method, path string, user int64, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", f.bearer(user))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(KeyHeader, key)
	}
	w := httptest.NewRecorder()
	f.router.ServeHTTP(w, req)
	return w
}

func (f *fixture) token(user int64) string {
	w := f.do("POST", "/api/v1/idempotency-tokens", user, "", "")
	if w.Code != http.StatusCreated {
		f.t.Fatalf("issue: %d %s", w.Code, w.Body)
	}
	var tok Token
	if err := json.Unmarshal(w.Body.Bytes(), &tok); err != nil {
		f.t.Fatal(err)
	}
	if !tokenPattern.MatchString(tok.Key) || !tok.ExpiresAt.After(time.Now()) {
		f.t.Fatalf("issued %+v", tok)
	}
	return tok.Key
}

func want(t *testing.T, w *httptest.ResponseRecorder, status int, fragment string) {
	t.Helper()
	if w.Code != status || !strings.Contains(w.Body.String(), fragment) {
		t.Fatalf("got %d %s; want %d with %q", w.Code, w.Body, status, fragment)
	}
}

func TestReplay(t *testing.T) {
	f := newFixture(t, Options{})
	key := f.token(1)
	first := f.do("POST", "/api/v1/things", 1, key, `{"a":1}`)
	want(t, first, http.StatusCreated, `"call":1`)
	if first.Header().Get(ReplayedHeader) != "" {
		t.Fatal("the first response says it is a replay")
	}
	for _, form := range []string{key, `"` + key + `"`} { // Stripe's bare form and the draft's sf-string
		again := f.do("POST", "/api/v1/things", 1, form, `{"a":1}`)
		if again.Code != first.Code || again.Body.String() != first.Body.String() {
			t.Fatalf("replay %d %s; want %d %s", again.Code, again.Body, first.Code, first.Body)
		}
		if again.Header().Get(ReplayedHeader) != "true" || again.Header().Get("Location") != "/things/1" ||
			again.Header().Get("Content-Type") != first.Header().Get("Content-Type") {
			t.Fatalf("replay headers %v", again.Header())
		}
	}
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times, want 1", n)
	}
	want(t, f.do("POST", "/api/v1/things", 1, key, `{"a":2}`), http.StatusUnprocessableEntity, "idempotency-key-reused")
	want(t, f.do("POST", "/api/v1/things?x=1", 1, key, `{"a":1}`), http.StatusUnprocessableEntity, "idempotency-key-reused")
}

func TestRefusals(t *testing.T) {
	f := newFixture(t, Options{TTL: 300 * time.Millisecond})
	key := f.token(1)
	for _, tc := range []struct {
		name string
		user int64
		key  string
		code int
		slug string
	}{
		{"missing-400", 1, "", 400, "idempotency-key-missing"},
		{"never-issued-422", 1, "AAAAAAAAAAAAAAAAAAAAAA", 422, "idempotency-key-unknown"},
		{"malformed-422", 1, "not a token", 422, "idempotency-key-unknown"},
		{"other-user-422", 2, key, 422, "idempotency-key-unknown"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := f.do("POST", "/api/v1/things", tc.user, tc.key, `{}`)
			want(t, w, tc.code, tc.slug)
			if w.Header().Get("Content-Type") != problem.ContentType {
				t.Fatalf("Content-Type %q", w.Header().Get("Content-Type"))
			}
		})
	}
	time.Sleep(400 * time.Millisecond)
	want(t, f.do("POST", "/api/v1/things", 1, key, `{}`), 422, "idempotency-key-unknown")
	if n := f.calls.Load(); n != 0 {
		t.Fatalf("handler ran %d times for refused requests", n)
	}
}

func TestConcurrentDuplicateGets409(t *testing.T) {
	f := newFixture(t, Options{})
	entered, release := make(chan struct{}), make(chan struct{})
	inner := f.handler
	f.handler = func(c *gin.Context) {
		close(entered)
		<-release
		inner(c)
	}
	key := f.token(1)
	done := make(chan *httptest.ResponseRecorder)
	go func() { done <- f.do("POST", "/api/v1/things", 1, key, `{"a":1}`) }()
	<-entered
	want(t, f.do("POST", "/api/v1/things", 1, key, `{"a":1}`), http.StatusConflict, "idempotency-key-in-use")
	want(t, f.do("POST", "/api/v1/things", 1, key, `{"a":2}`), http.StatusUnprocessableEntity, "idempotency-key-reused")
	close(release)
	first := <-done
	want(t, first, http.StatusCreated, `"call":1`)
	again := f.do("POST", "/api/v1/things", 1, key, `{"a":1}`)
	if again.Body.String() != first.Body.String() || again.Header().Get(ReplayedHeader) != "true" {
		t.Fatalf("after the 409s: %d %s %v", again.Code, again.Body, again.Header())
	}
}

func TestServerErrorsAndRefusedRequestsAreNotStored(t *testing.T) {
	f := newFixture(t, Options{})
	inner := f.handler
	fail := map[int64]int{1: http.StatusServiceUnavailable} // call -> status
	var n atomic.Int64
	f.handler = func(c *gin.Context) {
		if status, ok := fail[n.Add(1)]; ok {
			problem.Write(c, problem.New(status, "busy", "try again"))
			return
		}
		inner(c)
	}
	key := f.token(1)
	want(t, f.do("POST", "/api/v1/things", 1, key, `{"a":1}`), http.StatusServiceUnavailable, "busy")
	// A malformed body is refused by the handler with 400, not stored...
	want(t, f.do("POST", "/api/v1/things", 1, key, `{"a":`), http.StatusBadRequest, "invalid-input")
	// ...so the token still runs the request, even with another body.
	want(t, f.do("POST", "/api/v1/things", 1, key, `{"a":3}`), http.StatusCreated, `"got":{"a":3}`)
	want(t, f.do("POST", "/api/v1/things", 1, key, `{"a":1}`), http.StatusUnprocessableEntity, "idempotency-key-reused")
}

func TestBusinessErrorsAreReplayed(t *testing.T) {
	f := newFixture(t, Options{})
	var n atomic.Int64
	f.handler = func(c *gin.Context) {
		n.Add(1)
		problem.Write(c, problem.New(http.StatusConflict, "sold-out", "no units left"))
	}
	key := f.token(1)
	first := f.do("POST", "/api/v1/things", 1, key, `{}`)
	want(t, first, http.StatusConflict, "sold-out")
	again := f.do("POST", "/api/v1/things", 1, key, `{}`)
	if again.Code != first.Code || again.Body.String() != first.Body.String() || again.Header().Get(ReplayedHeader) != "true" {
		t.Fatalf("replay of an error: %d %s", again.Code, again.Body)
	}
	if again.Header().Get("Content-Type") != problem.ContentType {
		t.Fatalf("replayed Content-Type %q", again.Header().Get("Content-Type"))
	}
	if n.Load() != 1 {
		t.Fatalf("handler ran %d times", n.Load())
	}
}

func TestDoNotStore(t *testing.T) {
	f := newFixture(t, Options{})
	var n atomic.Int64
	f.handler = func(c *gin.Context) {
		if n.Add(1) == 1 {
			DoNotStore(c)
			c.JSON(http.StatusConflict, gin.H{"pending": true})
			return
		}
		c.JSON(http.StatusOK, gin.H{"done": true})
	}
	key := f.token(1)
	want(t, f.do("POST", "/api/v1/things", 1, key, `{}`), http.StatusConflict, "pending")
	want(t, f.do("POST", "/api/v1/things", 1, key, `{}`), http.StatusOK, "done")
}

// TestCrashedHolderExpires: a process that took the in-flight marker and
// died blocks the token only until its lease runs out.
func TestCrashedHolderExpires(t *testing.T) {
	f := newFixture(t, Options{})
	key := f.token(1)
	crashed, err := f.idem.o.Locker.TryAcquire(context.Background(), LockKey(1, key), lockkit.WithTTL(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_ = crashed // never released: its process is gone
	want(t, f.do("POST", "/api/v1/things", 1, key, `{}`), http.StatusConflict, "idempotency-key-in-use")
	// Lost closes at the holder's own deadline, which is never later than
	// the server's: the server may keep the grant a few ms more.
	<-crashed.Lost()
	deadline := time.Now().Add(time.Second)
	w := f.do("POST", "/api/v1/things", 1, key, `{}`)
	for w.Code == http.StatusConflict && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		w = f.do("POST", "/api/v1/things", 1, key, `{}`)
	}
	want(t, w, http.StatusCreated, `"call":1`)
}

func TestPanicFreesToken(t *testing.T) {
	f := newFixture(t, Options{})
	inner := f.handler
	var n atomic.Int64
	f.handler = func(c *gin.Context) {
		if n.Add(1) == 1 {
			panic("boom")
		}
		inner(c)
	}
	key := f.token(1)
	want(t, f.do("POST", "/api/v1/things", 1, key, `{"a":1}`), http.StatusInternalServerError, "internal")
	want(t, f.do("POST", "/api/v1/things", 1, key, `{"a":2}`), http.StatusCreated, `"call":1`)
}
