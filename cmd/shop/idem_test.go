package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/idem"
	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/testenv"
)

// post is a POST to path as the user of token, with key as its
// Idempotency-Key unless "".
type post struct{ path, token, key, body string }

// send is one exchange, checked against openapi.yaml unless c is nil (the
// contract is not safe for concurrent use).
func send(t *testing.T, c *contract, srv *httptest.Server, p post) (*http.Response, string) {
	t.Helper()
	path, token, key, body := p.path, p.token, p.key, p.body
	req, err := http.NewRequest("POST", srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	if key != "" {
		req.Header.Set(idem.KeyHeader, key)
	}
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if c != nil {
		req.Body = io.NopCloser(strings.NewReader(body))
		c.check(t, req, res, b)
	}
	return res, string(b)
}

func randomKey() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// TestIdempotentRoutes: every money-moving POST takes an optional
// Idempotency-Key. A retry, however the JSON is spelt, gets the first
// answer and moves nothing; another request with the key is 422; a blank
// key is 400; a duplicate while the first runs is 409.
func TestIdempotentRoutes(t *testing.T) {
	srv, _ := newTestServer(t, map[string]string{"SHOP_CRITICAL_SECTION_DELAY": "300ms"})
	c := newContract(t, srv.URL)
	u1 := shoptestToken(t, 1)
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/reset", token: testAdmin, status: 200})
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/products", token: testAdmin, status: 201,
		body: `{"sku":"api-1","name":"API item","stock":50,"price_cents":250}`})
	for _, tc := range []idempotentRoute{
		{"deposit", "/api/v1/accounts/1/deposit", `{"amount_cents":100}`, `{ "amount_cents": 100.0 }`, `{"amount_cents":101}`, 200},
		{"withdraw", "/api/v1/accounts/1/withdraw", `{"amount_cents":30}`, `{"amount_cents":3e1}`, `{"amount_cents":31}`, 200},
		{"transfer", "/api/v1/transfers", `{"from":1,"to":2,"amount_cents":7}`, `{"amount_cents":7,"to":2,"from":1}`, `{"from":1,"to":2,"amount_cents":8}`, 200},
		{"purchase", "/api/v1/seckill/api-1/purchase", `{"quantity":1}`, "{\n\"quantity\": 1\n}", `{"quantity":2}`, 201},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.checkRetriesReplay(t, c, srv, u1)
			tc.checkConcurrentCopies(t, srv, u1)
		})
	}
}

// idempotentRoute is a money-moving POST: its body, the same body spelt
// otherwise, another body, and the status of its success.
type idempotentRoute struct {
	name, path           string
	body, respelt, other string
	status               int
}

// checkRetriesReplay: retries with the key, in either spelling, replay the
// first answer; another body with it is 422, a blank key 400; only the
// first request moved anything.
func (tc idempotentRoute) checkRetriesReplay(t *testing.T, c *contract, srv *httptest.Server, token string) {
	t.Helper()
	key := randomKey()
	before := snapshot(t, c, srv)
	first, firstBody := send(t, c, srv, post{tc.path, token, key, tc.body})
	if first.StatusCode != tc.status || first.Header.Get(idem.ReplayedHeader) != "" {
		t.Fatalf("first: %d %v %s", first.StatusCode, first.Header, firstBody)
	}
	moved := snapshot(t, c, srv)
	for _, body := range []string{tc.body, tc.respelt} {
		again, againBody := send(t, c, srv, post{tc.path, token, key, body})
		if again.StatusCode != tc.status || againBody != firstBody || again.Header.Get(idem.ReplayedHeader) != "true" ||
			again.Header.Get(idem.ReplayedRequestIDHeader) != first.Header.Get(problem.RequestIDHeader) ||
			again.Header.Get(problem.RequestIDHeader) == first.Header.Get(problem.RequestIDHeader) {
			t.Fatalf("retry %s: %d %v %s; first %d %v %s", body, again.StatusCode, again.Header, againBody, first.StatusCode, first.Header, firstBody)
		}
	}
	c.run(t, srv, apiCase{method: "POST", path: tc.path, token: token, body: tc.other, header: map[string]string{idem.KeyHeader: key},
		status: 422, detail: "used for a different request"})
	c.run(t, srv, apiCase{method: "POST", path: tc.path, token: token, body: tc.body, header: map[string]string{idem.KeyHeader: " "},
		status: 400, detail: "Idempotency-Key is empty"})
	if after := snapshot(t, c, srv); fmt.Sprint(after) != fmt.Sprint(moved) || fmt.Sprint(moved) == fmt.Sprint(before) {
		t.Fatalf("before %v, after the first %v, after the retries %v: want one change", before, moved, after)
	}
}

// checkConcurrentCopies: of two copies at once, one runs, the other is
// told it is in flight.
func (tc idempotentRoute) checkConcurrentCopies(t *testing.T, srv *httptest.Server, token string) {
	t.Helper()
	key := randomKey()
	codes := make(chan int, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, _ := send(t, nil, srv, post{tc.path, token, key, tc.body})
			codes <- res.StatusCode
		}()
	}
	wg.Wait()
	close(codes)
	got := map[int]int{}
	for code := range codes {
		got[code]++
	}
	if got[tc.status] != 1 || got[http.StatusConflict] != 1 {
		t.Fatalf("two concurrent copies answered %v; want one %d and one 409", got, tc.status)
	}
}

// TestKeyedRequestsBoundedMemory: 1,000 orders, and 1,000 keyed deposits,
// through the whole service on the real Redis, each retried once, leave
// no key without a TTL beyond what was there before (the per-account and
// per-product lock fences), and no more keys than their live idempotency
// records: one per key.
func TestKeyedRequestsBoundedMemory(t *testing.T) {
	addr := testenv.Require(t, "SHOP_TEST_REDIS_ADDR")
	prefix := "shop_idem_test_" + randomKey()[:8] + ":"
	rk := prefixedKeys{rdb: redis.NewClient(&redis.Options{Addr: addr}), prefix: prefix}
	t.Cleanup(rk.deleteAll)
	// Every one-unit order is left unpaid.
	srv, _ := newTestServer(t, map[string]string{"SHOP_REDIS_ADDRS": addr, "SHOP_KEY_PREFIX": prefix,
		"SHOP_ORDER_MAX_UNPAID_UNITS": fmt.Sprint(keyedRequests)})
	c := newContract(t, srv.URL)
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/reset", token: testAdmin, status: 200})
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/products", token: testAdmin, status: 201,
		body: `{"sku":"penny","name":"Penny sweet","stock":100000,"price_cents":1}`})
	tokens := make([]string, keyedUsers+1)
	for u := range tokens[1:] {
		tokens[u+1] = shoptestToken(t, int64(u+1))
	}
	mint := func(u int) string {
		var tok idem.Token
		_ = json.Unmarshal(c.run(t, srv, apiCase{method: "POST", path: "/api/v1/idempotency-tokens", token: tokens[u], status: 201}), &tok)
		return tok.Key
	}
	for _, tc := range []keyedFlow{
		{"orders", func(int) string { return "/api/v1/orders" }, `{"sku":"penny","quantity":1}`, mint, http.StatusCreated},
		{"deposits", func(u int) string { return fmt.Sprintf("/api/v1/accounts/%d/deposit", u) }, `{"amount_cents":1}`,
			func(int) string { return randomKey() }, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.run(t, c, srv, tokens, rk) })
	}
}

// keyedRequests are spread over keyedUsers users.
const keyedRequests, keyedUsers = 1000, 10

// keyedFlow is a keyed POST: where user u sends it, with which body, under
// which key, and the status of its success.
type keyedFlow struct {
	name   string
	path   func(u int) string
	body   string
	key    func(u int) string
	status int
}

func (tc keyedFlow) run(t *testing.T, c *contract, srv *httptest.Server, tokens []string, rk prefixedKeys) {
	// One request per user first: the locks of the rows it touches
	// keep their fence counters (one per account or product, not
	// per request), and each user's token index appears.
	for u := 1; u <= keyedUsers; u++ {
		send(t, c, srv, post{tc.path(u), tokens[u], tc.key(u), tc.body})
	}
	const n = keyedRequests
	before, beforeNoTTL := rk.count(t)
	for i := range n {
		u := 1 + i%keyedUsers
		path, key := tc.path(u), tc.key(u)
		for range 2 { // the request and its retry
			if res, b := send(t, c, srv, post{path, tokens[u], key, tc.body}); res.StatusCode != tc.status {
				t.Fatalf("request %d: %d %s", i, res.StatusCode, b)
			}
		}
	}
	after, afterNoTTL := rk.count(t)
	if afterNoTTL != beforeNoTTL {
		t.Errorf("keys without a TTL: %d before, %d after %d keyed requests", beforeNoTTL, afterNoTTL, n)
	}
	if after-before != n {
		t.Errorf("%d keyed requests added %d keys; their live records need %d", n, after-before, n)
	}
	t.Logf("%d keyed %s (and as many replays): %d keys before (%d without TTL), %d after (%d without TTL)",
		n, tc.name, before, beforeNoTTL, after, afterNoTTL)
}

// prefixedKeys are the Redis keys of one shop instance's key prefix, hash
// tagged or not.
type prefixedKeys struct {
	rdb    *redis.Client
	prefix string
}

func (k prefixedKeys) patterns() []string { return []string{k.prefix + "*", "{" + k.prefix + "*"} }

// count counts the keys, and those without a TTL. The event relay's
// leader lease is left out: it is taken for each drain of the outbox and
// comes and goes with the orders' commits, not with the requests' records.
func (k prefixedKeys) count(t *testing.T) (all, noTTL int) {
	t.Helper()
	ctx := context.Background()
	for _, pattern := range k.patterns() {
		it := k.rdb.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			switch ttl := k.rdb.PTTL(ctx, it.Val()).Val(); {
			case ttl > 0 && strings.Contains(it.Val(), events.LeaderKey.String()):
			case ttl == -2: // expired meanwhile
			case ttl < 0:
				all++
				noTTL++
			default:
				all++
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
	}
	return all, noTTL
}

// deleteAll deletes the keys and closes the client.
func (k prefixedKeys) deleteAll() {
	ctx := context.Background()
	for _, pattern := range k.patterns() {
		it := k.rdb.Scan(ctx, 0, pattern, 1000).Iterator()
		for it.Next(ctx) {
			k.rdb.Del(ctx, it.Val())
		}
	}
	k.rdb.Close()
}
