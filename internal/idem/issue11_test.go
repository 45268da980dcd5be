package idem

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/problem"
)

// liveKeys counts the fixture's keys in Redis, and those of them without a
// TTL; a key that has expired but was not yet reclaimed is not counted.
func (f *fixture) liveKeys() (all, noTTL int) {
	f.t.Helper()
	ctx := context.Background()
	for _, pattern := range []string{f.prefix + "*", "{" + f.prefix + "*"} {
		it := f.client.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			ttl, err := f.client.PTTL(ctx, it.Val()).Result()
			if err != nil {
				f.t.Fatal(err)
			}
			switch {
			case ttl == -2: // expired meanwhile
			case ttl < 0:
				all++
				noTTL++
			default:
				all++
			}
		}
		if err := it.Err(); err != nil {
			f.t.Fatal(err)
		}
	}
	return all, noTTL
}

// TestKeyedRequestsLeaveNoKeyWithoutTTL: 1,000 requests, each with its own
// token, leave nothing in Redis that lives for ever; what they leave is
// what the live tokens need.
func TestKeyedRequestsLeaveNoKeyWithoutTTL(t *testing.T) {
	f := newFixture(t, Options{})
	const n = 1000
	keys := make([]string, n)
	for i := range keys {
		keys[i] = f.token(1)
	}
	before, beforeNoTTL := f.liveKeys()
	for i, key := range keys {
		want(t, f.do("POST", "/api/v1/things", 1, key, `{"i":`+strings.Repeat("1", 1+i%5)+`}`), http.StatusCreated, `"got"`)
	}
	after, afterNoTTL := f.liveKeys()
	if afterNoTTL != beforeNoTTL {
		t.Errorf("keys without a TTL: %d before the requests, %d after", beforeNoTTL, afterNoTTL)
	}
	if after-before > 0 {
		t.Errorf("%d requests on %d live tokens added %d keys; the tokens' records were already there", n, n, after-before)
	}
}

// TestTokenMintingIsCapped: a user cannot mint tokens without bound.
func TestTokenMintingIsCapped(t *testing.T) {
	f := newFixture(t, Options{})
	for range DefaultMaxTokens {
		f.token(1)
	}
	w := f.do("POST", "/api/v1/idempotency-tokens", 1, "", "")
	want(t, w, http.StatusTooManyRequests, "idempotency-tokens-exhausted")
	if w.Header().Get("Retry-After") == "" {
		t.Error("no Retry-After on the refusal")
	}
	f.token(2) // another user is not affected
}

// TestFingerprintIsCanonicalJSON: a retry that spells the same JSON
// differently (spaces, key order, 1.0 for 1) is the same request.
func TestFingerprintIsCanonicalJSON(t *testing.T) {
	f := newFixture(t, Options{})
	key := f.token(1)
	first := f.do("POST", "/api/v1/things", 1, key, `{"a":1,"b":[true,null,"x"]}`)
	want(t, first, http.StatusCreated, `"call":1`)
	for _, body := range []string{
		`{"a":1, "b":[true, null, "x"]}`,
		"{\n  \"b\": [true,null,\"x\"],\n  \"a\": 1\n}",
		`{"a":1.0,"b":[true,null,"\u0078"]}`,
		`{"a":10e-1,"b":[true,null,"x"]}`,
	} {
		again := f.do("POST", "/api/v1/things", 1, key, body)
		if again.Code != first.Code || again.Body.String() != first.Body.String() || again.Header().Get(ReplayedHeader) != "true" {
			t.Errorf("body %s: %d %s, want a replay of the first", body, again.Code, again.Body)
		}
	}
	for _, body := range []string{`{"a":2,"b":[true,null,"x"]}`, `{"a":1,"b":[null,true,"x"]}`, `{"a":1}`} {
		want(t, f.do("POST", "/api/v1/things", 1, key, body), http.StatusUnprocessableEntity, "idempotency-key-reused")
	}
}

// TestBlankKeyIs400: an empty or blank Idempotency-Key is a malformed
// request, not an unknown token.
func TestBlankKeyIs400(t *testing.T) {
	f := newFixture(t, Options{})
	for _, key := range []string{" ", `""`, "\t", `" "`} {
		want(t, f.do("POST", "/api/v1/things", 1, key, `{}`), http.StatusBadRequest, "idempotency-key-invalid")
	}
}

// TestReplayNamesTheRequestItReplays: a replay has an X-Request-Id of its
// own, names the first request's in a header, and its body (which says
// request_id of the first) agrees with that header.
func TestReplayNamesTheRequestItReplays(t *testing.T) {
	f := newFixture(t, Options{})
	f.handler = func(c *gin.Context) {
		problem.Write(c, problem.New(http.StatusConflict, "sold-out", "no units left"))
	}
	key := f.token(1)
	first := f.do("POST", "/api/v1/things", 1, key, `{}`)
	again := f.do("POST", "/api/v1/things", 1, key, `{}`)
	firstID, againID := first.Header().Get(problem.RequestIDHeader), again.Header().Get(problem.RequestIDHeader)
	if firstID == "" || againID == "" || firstID == againID {
		t.Fatalf("X-Request-Id first %q, replay %q: want two different ids", firstID, againID)
	}
	if got := again.Header().Get(ReplayedRequestIDHeader); got != firstID {
		t.Fatalf("%s = %q, want the first request's id %q", ReplayedRequestIDHeader, got, firstID)
	}
	var body problem.Details
	if err := json.Unmarshal(again.Body.Bytes(), &body); err != nil || body.RequestID != firstID {
		t.Fatalf("replayed body %s: request_id should name the request that produced it, %q", again.Body, firstID)
	}
}
