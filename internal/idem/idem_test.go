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
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/testenv"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler)) // the panics and 503s below are meant
	goleak.VerifyTestMain(m)
}

const testSecret = "idem-test-secret-of-at-least-32-bytes!"

// Routes of the fixture, one per guard.
const (
	required = "/api/v1/things"       // Middleware(): minted tokens only
	optional = "/api/v1/accounts/1/x" // Optional(): the client's keys, or none
	rerun    = "/api/v1/orders/1/pay" // Guard(Policy{RerunServerErrors: true})
)

// fixture is a router with the guards in front of a handler the test
// steers, on the real Redis.
type fixture struct {
	t       testing.TB
	idem    *Idem
	router  *gin.Engine
	auth    *auth.Auth
	client  redis.UniversalClient
	prefix  string
	calls   atomic.Int64
	handler func(c *gin.Context) // what every guarded route does
}

func singleNode(t testing.TB) redis.UniversalClient {
	return redis.NewClient(&redis.Options{Addr: testenv.Require(t, "SHOP_TEST_REDIS_ADDR")})
}

func cluster(t testing.TB) redis.UniversalClient {
	return redis.NewClusterClient(&redis.ClusterOptions{Addrs: testenv.RequireList(t, "SHOP_TEST_REDIS_CLUSTER_ADDRS")})
}

// onBoth runs test on a single node and on a Cluster.
func onBoth(t *testing.T, test func(t *testing.T, client func(testing.TB) redis.UniversalClient)) {
	t.Run("single", func(t *testing.T) { test(t, singleNode) })
	t.Run("cluster", func(t *testing.T) { test(t, cluster) })
}

// scan calls fn for every key matching pattern, on every master of a
// Cluster.
func scan(ctx context.Context, t testing.TB, client redis.UniversalClient, pattern string, fn func(c redis.UniversalClient, key string)) {
	t.Helper()
	var mu sync.Mutex // ForEachMaster runs on the masters at once
	each := func(ctx context.Context, c *redis.Client) error {
		it := c.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			mu.Lock()
			fn(c, it.Val())
			mu.Unlock()
		}
		return it.Err()
	}
	var err error
	switch c := client.(type) {
	case *redis.ClusterClient:
		err = c.ForEachMaster(ctx, each)
	case *redis.Client:
		err = each(ctx, c)
	}
	if err != nil {
		t.Fatal(err)
	}
}

func newFixture(t testing.TB, o Options) *fixture { return newFixtureOn(t, singleNode(t), o) }

func newFixtureOn(t testing.TB, client redis.UniversalClient, o Options) *fixture {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "idem_test:" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		ctx := context.Background()
		scan(ctx, t, client, prefix+"*", func(c redis.UniversalClient, key string) { c.Del(ctx, key) })
		client.Close()
	})
	o.Prefix = prefix
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
		c.JSON(http.StatusCreated, gin.H{"call": n, "got": body, "key": Key(c)})
	}
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.Use(newRequestID, problem.Recover())
	api := r.Group("/api/v1", f.auth.User())
	m.Register(api)
	api.POST("/things", m.Middleware(), func(c *gin.Context) { f.handler(c) })
	api.POST("/accounts/:id/x", m.Optional(), func(c *gin.Context) { f.handler(c) })
	api.POST("/skus/:sku/x", m.Optional(), func(c *gin.Context) { f.handler(c) })
	api.POST("/orders/:id/pay", m.Guard(Policy{RerunServerErrors: true}), func(c *gin.Context) { f.handler(c) })
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
	f.t.Helper()
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

func uuid() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	h := hex.EncodeToString(b)
	return h[:8] + "-" + h[8:12] + "-4" + h[13:16] + "-a" + h[17:20] + "-" + h[20:]
}

func want(t *testing.T, w *httptest.ResponseRecorder, status int, fragment string) {
	t.Helper()
	if w.Code != status || !strings.Contains(w.Body.String(), fragment) {
		t.Fatalf("got %d %s; want %d with %q", w.Code, w.Body, status, fragment)
	}
	if status >= 400 && w.Header().Get("Content-Type") != problem.ContentType {
		t.Fatalf("a %d with Content-Type %q", w.Code, w.Header().Get("Content-Type"))
	}
}

// wantReplay checks that again is first sent again, marked as a replay.
func wantReplay(t *testing.T, first, again *httptest.ResponseRecorder) {
	t.Helper()
	if again.Code != first.Code || again.Body.String() != first.Body.String() {
		t.Fatalf("replay %d %s; want %d %s", again.Code, again.Body, first.Code, first.Body)
	}
	firstID := first.Header().Get(problem.RequestIDHeader)
	if again.Header().Get(ReplayedHeader) != "true" || again.Header().Get(ReplayedRequestIDHeader) != firstID ||
		again.Header().Get(problem.RequestIDHeader) == firstID {
		t.Fatalf("replay headers %v; first X-Request-Id %q", again.Header(), firstID)
	}
	for _, h := range keyed.StoredHeaders {
		if again.Header().Get(h) != first.Header().Get(h) {
			t.Fatalf("replayed %s %q, first %q", h, again.Header().Get(h), first.Header().Get(h))
		}
	}
}

func TestReplay(t *testing.T) {
	onBoth(t, func(t *testing.T, client func(testing.TB) redis.UniversalClient) {
		f := newFixtureOn(t, client(t), Options{})
		token := f.token(1)
		for _, tc := range []struct {
			name, path, key string
			forms           []string // other spellings of key
		}{
			{"required-token", required, token, []string{`"` + token + `"`, " " + token + "\t"}},
			{"optional-uuid", optional, uuid(), nil},
			{"optional-sf-string", optional, `"a key, with \"quotes\""`, []string{`  "a key, with \"quotes\""`}},
			{"optional-255", optional, strings.Repeat("k", MaxKeyLength), nil},
			{"optional-minted-token", optional, f.token(1), nil},
			{"rerun-uuid", rerun, uuid(), nil},
		} {
			t.Run(tc.name, func(t *testing.T) {
				before := f.calls.Load()
				first := f.do("POST", tc.path, 1, tc.key, `{"a":1}`)
				want(t, first, http.StatusCreated, `"got":{"a":1}`)
				if first.Header().Get(ReplayedHeader) != "" || first.Header().Get(ReplayedRequestIDHeader) != "" {
					t.Fatal("the first response says it is a replay")
				}
				for _, form := range append([]string{tc.key}, tc.forms...) {
					wantReplay(t, first, f.do("POST", tc.path, 1, form, `{"a":1}`))
				}
				if n := f.calls.Load() - before; n != 1 {
					t.Fatalf("handler ran %d times, want 1", n)
				}
				want(t, f.do("POST", tc.path, 1, tc.key, `{"a":2}`), http.StatusUnprocessableEntity, "idempotency-key-reused")
				want(t, f.do("POST", tc.path+"?x=1", 1, tc.key, `{"a":1}`), http.StatusUnprocessableEntity, "idempotency-key-reused")
			})
		}
	})
}

// TestFingerprintIsCanonicalJSON: a retry that spells the same JSON
// differently (spaces, key order, 1.0 for 1, escapes) is the same request;
// another value anywhere is another request.
func TestFingerprintIsCanonicalJSON(t *testing.T) {
	f := newFixture(t, Options{})
	for _, path := range []string{required, optional} {
		key := uuid()
		if path == required {
			key = f.token(1)
		}
		first := f.do("POST", path, 1, key, `{"a":1,"b":[true,null,"x"],"c":{"d":-0.5}}`)
		want(t, first, http.StatusCreated, `"a":1`)
		for _, tc := range []struct{ name, body string }{
			{"spaces", `{"a":1, "b":[true, null, "x"], "c":{"d":-0.5}}`},
			{"indented-reordered", "{\n  \"c\": {\"d\": -0.50},\n  \"b\": [true,null,\"x\"],\n  \"a\": 1\n}"},
			{"number-spellings", `{"a":1.0,"b":[true,null,"x"],"c":{"d":-5e-1}}`},
			{"string-escape", `{"a":10E-1,"b":[true,null,"\u0078"],"c":{"d":-0.05e+1}}`},
		} {
			t.Run(path+"/same-"+tc.name, func(t *testing.T) { wantReplay(t, first, f.do("POST", path, 1, key, tc.body)) })
		}
		for _, tc := range []struct{ name, body string }{
			{"value", `{"a":2,"b":[true,null,"x"],"c":{"d":-0.5}}`},
			{"array-order", `{"a":1,"b":[null,true,"x"],"c":{"d":-0.5}}`},
			{"member-missing", `{"a":1,"b":[true,null,"x"]}`},
			{"string-for-number", `{"a":"1","b":[true,null,"x"],"c":{"d":-0.5}}`},
			{"sign", `{"a":1,"b":[true,null,"x"],"c":{"d":0.5}}`},
		} {
			t.Run(path+"/other-"+tc.name, func(t *testing.T) {
				want(t, f.do("POST", path, 1, key, tc.body), http.StatusUnprocessableEntity, "idempotency-key-reused")
			})
		}
	}
}

func TestRefusals(t *testing.T) {
	f := newFixture(t, Options{TTL: 300 * time.Millisecond})
	token := f.token(1)
	clientKey := uuid()
	want(t, f.do("POST", optional, 1, clientKey, `{}`), http.StatusCreated, `"call":1`)
	for _, tc := range []struct {
		name string
		path string
		user int64
		key  string
		code int
		slug string
	}{
		{"required-missing-400", required, 1, "", 400, "idempotency-key-missing"},
		{"required-never-issued-422", required, 1, "AAAAAAAAAAAAAAAAAAAAAA", 422, "idempotency-key-unknown"},
		{"required-made-up-422", required, 1, "made-up", 422, "idempotency-key-unknown"},
		{"required-uuid-422", required, 1, uuid(), 422, "idempotency-key-unknown"},
		{"required-client-key-422", required, 1, clientKey, 422, "idempotency-key-unknown"},
		{"required-other-user-422", required, 2, token, 422, "idempotency-key-unknown"},
		{"blank-400", optional, 1, " ", 400, "is empty"},
		{"tab-400", required, 1, "\t", 400, "is empty"},
		{"empty-sf-string-400", optional, 1, `""`, 400, "is empty"},
		{"blank-sf-string-400", required, 1, `" "`, 400, "is empty"},
		{"256-400", optional, 1, strings.Repeat("k", MaxKeyLength+1), 400, "256 characters"},
		{"inner-space-400", optional, 1, "not a token", 400, "' ' at byte 3"},
		{"list-400", optional, 1, token + ",other", 400, "','"},
		{"non-ascii-400", optional, 1, "clé", 400, "the non-ASCII byte 0xc3 at byte 2"},
		{"unclosed-quote-400", optional, 1, `"abc`, 400, "Structured Field string"},
		{"bad-escape-400", optional, 1, `"a\b"`, 400, "Structured Field string"},
		{"after-quote-400", optional, 1, `"a"b`, 400, "Structured Field string"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := f.do("POST", tc.path, tc.user, tc.key, `{}`)
			want(t, w, tc.code, tc.slug)
		})
	}
	t.Run("two-headers-400", func(t *testing.T) {
		req := httptest.NewRequest("POST", optional, strings.NewReader(`{}`))
		req.Header.Set("Authorization", f.bearer(1))
		req.Header.Add(KeyHeader, "a")
		req.Header.Add(KeyHeader, "b")
		w := httptest.NewRecorder()
		f.router.ServeHTTP(w, req)
		want(t, w, 400, "not 2")
	})
	if n := f.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times for refused requests", n-1)
	}
	time.Sleep(400 * time.Millisecond)
	t.Run("required-expired-422", func(t *testing.T) {
		want(t, f.do("POST", required, 1, token, `{}`), 422, "idempotency-key-unknown")
	})
	t.Run("optional-expired-runs-again", func(t *testing.T) {
		want(t, f.do("POST", optional, 1, clientKey, `{}`), 201, `"call":2`)
	})
}

// TestKeysArePerUser: two users with the same key never meet; a user's
// key on another route is another request.
func TestKeysArePerUser(t *testing.T) {
	f := newFixture(t, Options{})
	key := uuid()
	want(t, f.do("POST", optional, 1, key, `{"a":1}`), 201, `"call":1`)
	want(t, f.do("POST", optional, 2, key, `{"a":1}`), 201, `"call":2`)
	want(t, f.do("POST", optional, 2, key, `{"a":2}`), 422, "idempotency-key-reused")
	want(t, f.do("POST", rerun, 1, key, `{"a":1}`), 422, "idempotency-key-reused")
	token := f.token(1)
	want(t, f.do("POST", optional, 1, token, `{"a":1}`), 201, `"call":3`)
	want(t, f.do("POST", required, 1, token, `{"a":1}`), 422, "idempotency-key-reused")
}

func TestNoKeyOnOptionalRouteRunsEveryTime(t *testing.T) {
	f := newFixture(t, Options{})
	for i := int64(1); i <= 3; i++ {
		w := f.do("POST", optional, 1, "", `{"a":1}`)
		want(t, w, http.StatusCreated, `"key":""`)
		if w.Header().Get(ReplayedHeader) != "" || f.calls.Load() != i {
			t.Fatalf("call %d: %v, handler ran %d times", i, w.Header(), f.calls.Load())
		}
	}
}

func TestConcurrentDuplicateGets409(t *testing.T) {
	onBoth(t, func(t *testing.T, client func(testing.TB) redis.UniversalClient) {
		f := newFixtureOn(t, client(t), Options{})
		for _, path := range []string{required, optional} {
			t.Run(path, func(t *testing.T) {
				entered, release := make(chan struct{}), make(chan struct{})
				inner := f.handler
				f.handler = func(c *gin.Context) {
					close(entered)
					<-release
					inner(c)
				}
				defer func() { f.handler = inner }()
				key := uuid()
				if path == required {
					key = f.token(1)
				}
				done := make(chan *httptest.ResponseRecorder)
				go func() { done <- f.do("POST", path, 1, key, `{"a":1}`) }()
				<-entered
				w := f.do("POST", path, 1, key, `{"a":1}`)
				want(t, w, http.StatusConflict, "idempotency-key-in-use")
				if w.Header().Get("Retry-After") != "1" {
					t.Fatalf("409 without Retry-After: %v", w.Header())
				}
				want(t, f.do("POST", path, 1, key, `{"a":2}`), http.StatusUnprocessableEntity, "idempotency-key-reused")
				close(release)
				first := <-done
				want(t, first, http.StatusCreated, `"got":{"a":1}`)
				wantReplay(t, first, f.do("POST", path, 1, key, `{"a":1}`))
			})
		}
	})
}

// TestWhatIsStored: which answers a retry gets again, and which let it run
// again, per guard.
func TestWhatIsStored(t *testing.T) {
	f := newFixture(t, Options{})
	var status atomic.Int64
	f.handler = func(c *gin.Context) {
		n := f.calls.Add(1)
		if s := int(status.Load()); s != 0 {
			problem.Write(c, problem.New(s, "steered", "steered"))
			return
		}
		c.JSON(http.StatusOK, gin.H{"call": n})
	}
	for _, tc := range []struct {
		name   string
		path   string
		status int
		stored bool
	}{
		{"409-stored", optional, 409, true},
		{"422-stored", optional, 422, true},
		{"404-stored", optional, 404, true},
		{"500-stored", optional, 500, true},
		{"502-stored", optional, 502, true},
		{"503-rerun", optional, 503, false},
		{"400-rerun", optional, 400, false},
		{"408-rerun", optional, 408, false},
		{"413-rerun", optional, 413, false},
		{"415-rerun", optional, 415, false},
		{"429-rerun", optional, 429, false},
		{"required-500-rerun", required, 500, false},
		{"required-409-stored", required, 409, true},
		{"rerun-500-rerun", rerun, 500, false},
		{"rerun-504-rerun", rerun, 504, false},
		{"rerun-422-stored", rerun, 422, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := uuid()
			if tc.path == required {
				key = f.token(1)
			}
			status.Store(int64(tc.status))
			first := f.do("POST", tc.path, 1, key, `{}`)
			want(t, first, tc.status, "steered")
			status.Store(0)
			before := f.calls.Load()
			again := f.do("POST", tc.path, 1, key, `{}`)
			if tc.stored {
				wantReplay(t, first, again)
				return
			}
			want(t, again, http.StatusOK, `"call"`)
			if f.calls.Load() != before+1 {
				t.Fatal("the retry did not run")
			}
		})
	}
	t.Run("refused-then-another-body", func(t *testing.T) {
		// A request refused before it ran frees its key for any body.
		key := uuid()
		status.Store(400)
		want(t, f.do("POST", optional, 1, key, `{"a":`), 400, "steered")
		status.Store(0)
		want(t, f.do("POST", optional, 1, key, `{"a":3}`), 200, `"call"`)
		want(t, f.do("POST", optional, 1, key, `{"a":1}`), 422, "idempotency-key-reused")
	})
	t.Run("do-not-store", func(t *testing.T) {
		var n atomic.Int64
		f.handler = func(c *gin.Context) {
			if n.Add(1) == 1 {
				DoNotStore(c)
				problem.Write(c, problem.New(http.StatusConflict, "pending", "an earlier attempt is still running"))
				return
			}
			c.JSON(http.StatusOK, gin.H{"done": true})
		}
		key := uuid()
		want(t, f.do("POST", optional, 1, key, `{}`), http.StatusConflict, "pending")
		want(t, f.do("POST", optional, 1, key, `{}`), http.StatusOK, "done")
	})
}

// TestPanic: a panic is a 500 like any other. On an Optional route it is
// stored, since the handler may have written before it; where server
// errors rerun, the key is freed.
func TestPanic(t *testing.T) {
	f := newFixture(t, Options{})
	inner := f.handler
	var n atomic.Int64
	f.handler = func(c *gin.Context) {
		if n.Add(1)%2 == 1 {
			panic("boom")
		}
		inner(c)
	}
	key := uuid()
	first := f.do("POST", optional, 1, key, `{"a":1}`)
	want(t, first, http.StatusInternalServerError, "internal")
	wantReplay(t, first, f.do("POST", optional, 1, key, `{"a":1}`))

	n.Store(0)
	key = uuid()
	want(t, f.do("POST", rerun, 1, key, `{"a":1}`), http.StatusInternalServerError, "internal")
	want(t, f.do("POST", rerun, 1, key, `{"a":2}`), http.StatusCreated, `"got":{"a":2}`)
}

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

// TestCaseFoldedDuplicateMembersAreRefusedNotReplayed: encoding/json
// matches member names to struct fields without regard to case, the last
// match winning, so {"amount":100,"AMOUNT":500} would deposit 500 and
// {"AMOUNT":500,"amount":100} 100. DecodeJSON refuses both (400, not
// stored), and neither is answered with the other's outcome.
func TestCaseFoldedDuplicateMembersAreRefusedNotReplayed(t *testing.T) {
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
	want(t, f.do("POST", optional, 1, key, `{"amount":100,"AMOUNT":500}`), http.StatusBadRequest, `member \"AMOUNT\" appears twice`)
	second := f.do("POST", optional, 1, key, `{"AMOUNT":500,"amount":100}`)
	want(t, second, http.StatusBadRequest, `member \"amount\" appears twice`)
	if second.Header().Get(ReplayedHeader) == "true" || f.calls.Load() != 0 {
		t.Fatalf("a refused body ran or was replayed: %d runs, %s", f.calls.Load(), second.Body)
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

// TestAClaimWhoseReplyIsLostStillRuns: the claim of a key runs, then the
// connection drops before its reply (a failover, a cut link), and the
// client sends it again. The resend must find its own claim, not a
// request in flight that holds the key: the request runs once, answered
// 201, rather than 409 with the key blocked for a lease by nobody.
func TestAClaimWhoseReplyIsLostStillRuns(t *testing.T) {
	ctx := context.Background()
	direct := singleNode(t)
	t.Cleanup(func() { direct.Close() })
	// Loaded beforehand, so that the lost reply is the claim's, not a
	// NOSCRIPT that go-redis answers with EVAL.
	if err := claimScript.Load(ctx, direct).Err(); err != nil {
		t.Fatal(err)
	}
	cutter, via := testenv.NewReplyCutter(t, testenv.Require(t, "SHOP_TEST_REDIS_ADDR"), []byte(claimScript.Hash()))
	f := newFixtureOn(t, redis.NewClient(&redis.Options{Addr: via}), Options{})
	want(t, f.do("POST", optional, 1, uuid(), `{"a":1}`), http.StatusCreated, `"call":1`)
	if !cutter.Cut() {
		t.Fatal("no reply was lost: the test proves nothing")
	}
}

// TestFingerprintReadsIDsAsTheHandlerDoes: a retry that spells the path's
// id another way the handler parses to the same number (01, +1) is the
// same request and replays; another id is another request.
func TestFingerprintReadsIDsAsTheHandlerDoes(t *testing.T) {
	f := newFixture(t, Options{})
	key := uuid()
	first := f.do("POST", "/api/v1/accounts/1/x", 1, key, `{"a":1}`)
	want(t, first, http.StatusCreated, `"got":{"a":1}`)
	for _, path := range []string{"/api/v1/accounts/01/x", "/api/v1/accounts/+1/x"} {
		wantReplay(t, first, f.do("POST", path, 1, key, `{"a":1}`))
	}
	want(t, f.do("POST", "/api/v1/accounts/2/x", 1, key, `{"a":1}`), http.StatusUnprocessableEntity, "idempotency-key-reused")

	// A SKU is a name, not a number: 007 and 7 are two products.
	key = uuid()
	want(t, f.do("POST", "/api/v1/skus/007/x", 1, key, `{"a":1}`), http.StatusCreated, `"got":{"a":1}`)
	want(t, f.do("POST", "/api/v1/skus/7/x", 1, key, `{"a":1}`), http.StatusUnprocessableEntity, "idempotency-key-reused")
}
