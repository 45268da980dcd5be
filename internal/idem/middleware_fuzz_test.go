package idem

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/problem"
)

// FuzzMiddleware sends arbitrary Idempotency-Key values and bodies through
// both guards, on the real Redis. Whatever the input: no 5xx, every
// refusal is problem+json, the required guard runs the handler only under
// the token this user was minted, the optional one only under a key that
// parses, and a retry of a request that ran gets the same answer without
// running the handler again.
func FuzzMiddleware(f *testing.F) {
	client := singleNode(f)
	prefix := "idem_fuzz:" + strings.ReplaceAll(time.Now().Format("150405.000000"), ".", "") + ":"
	f.Cleanup(func() {
		ctx := context.Background()
		scan(ctx, f, client, prefix+"*", func(c redis.UniversalClient, key string) { c.Del(ctx, key) })
		client.Close()
	})
	m, err := New(client, Options{Prefix: prefix, TTL: time.Minute, Lease: 5 * time.Second, MaxTokens: 1 << 30})
	if err != nil {
		f.Fatal(err)
	}
	a := auth.New([]byte(testSecret), "admin")
	var calls atomic.Int64
	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.Use(problem.Recover(), problem.LimitBody(4096))
	api := r.Group("/api/v1", a.User())
	m.Register(api)
	handler := echoHandler(&calls)
	api.POST("/things", m.Middleware(), handler)
	api.POST("/accounts/:id/x", m.Optional(), handler)
	bearer, _ := a.Token(1, time.Hour, time.Now())
	do := func(path, key, body string) *httptest.ResponseRecorder { return post(r, bearer, path, key, body) }
	issue := func(t *testing.T) string {
		req := httptest.NewRequest("POST", "/api/v1/idempotency-tokens", nil)
		req.Header.Set("Authorization", "Bearer "+bearer)
		w := httptest.NewRecorder()
		r.ServeHTTP(w, req)
		if w.Code != http.StatusCreated {
			t.Fatalf("issue: %d %s", w.Code, w.Body)
		}
		_, rest, _ := strings.Cut(w.Body.String(), `"token":"`)
		key, _, _ := strings.Cut(rest, `"`)
		return key
	}

	// issued: the key is a fresh token with the fuzzed key appended, sent
	// to the required guard; otherwise the fuzzed key goes as it is to the
	// optional one.
	for _, s := range []struct {
		key, body string
		issued    bool
	}{
		{"", `{"a":1}`, true},
		{"", `{"a":1}`, false},
		{"not-a-token", `{}`, false},
		{`"quoted"`, `{"a":1}`, false},
		{`""`, `{}`, true},
		{"", `{"a":`, true},
		{"", `[]`, true},
		{"\x00\xff", `{}`, false},
		{strings.Repeat("k", 300), `{}`, false},
		{" ", `{"b":"c"}`, true},
	} {
		f.Add(s.key, s.body, s.issued)
	}
	f.Fuzz(func(t *testing.T, key, body string, issued bool) {
		token, path := "", optional
		if issued {
			token, path = issue(t), required
			key = token + key
		}
		before := calls.Load()
		w := do(path, key, body)
		ran := calls.Load() - before
		if w.Code >= 500 {
			t.Fatalf("key %q body %q: %d %s", key, body, w.Code, w.Body)
		}
		if w.Code >= 400 && !strings.HasPrefix(w.Header().Get("Content-Type"), problem.ContentType) {
			t.Fatalf("refusal %d is not problem+json: %q", w.Code, w.Header().Get("Content-Type"))
		}
		if ran != 0 && key != "" {
			ranUnderItsKey(t, key, token, issued)
		}
		if ran == 0 || key == "" {
			return
		}
		again := do(path, key, body)
		if calls.Load()-before != ran || again.Code != w.Code || again.Body.String() != w.Body.String() {
			t.Fatalf("retry of a request that ran: %d %s, first %d %s; handler runs %d",
				again.Code, again.Body, w.Code, w.Body, calls.Load()-before)
		}
	})
}

// echoHandler answers 201 with the request's key and body, counting its
// runs in calls.
func echoHandler(calls *atomic.Int64) gin.HandlerFunc {
	return func(c *gin.Context) {
		var body map[string]any
		if err := problem.DecodeJSON(c, &body); err != nil {
			problem.Write(c, err)
			return
		}
		calls.Add(1)
		c.JSON(http.StatusCreated, gin.H{"key": Key(c), "got": body})
	}
}

// ranUnderItsKey fails t unless key, under which the handler ran, parses
// and, when a token was issued, is that token.
func ranUnderItsKey(t *testing.T, key, token string, issued bool) {
	t.Helper()
	if parsed, err := parseKey(key); err != nil || (issued && parsed != token) {
		t.Fatalf("the handler ran for key %q (parsed %q, %v); token issued %q", key, parsed, err, token)
	}
}

// post sends body to path on r as the user of bearer, with key as its
// Idempotency-Key unless key is empty.
func post(r *gin.Engine, bearer, path, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+bearer)
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set(KeyHeader, key)
	}
	w := httptest.NewRecorder()
	r.ServeHTTP(w, req)
	return w
}
