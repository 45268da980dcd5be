package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/idem"
	"github.com/lockbench/shop/internal/shoptest"
)

// TestABatchedDuplicateOfAKeyDoesNotFailItsNeighbours: Redis loses a
// key while its first purchase holds the stock lock, and the key's retry
// queues behind it beside another user's keyed purchase, so the two are
// served as one combined batch. The retry's record collides with the
// first run's; the neighbour must still be sold its unit, and its key must
// not keep an answer that was never its own.
func TestABatchedDuplicateOfAKeyDoesNotFailItsNeighbours(t *testing.T) {
	const delay = time.Second // the others surely queue while the first is served
	addr := shoptest.Env(t, "SHOP_TEST_REDIS_ADDR")
	prefix := shoptest.Prefix("idembatch")
	srv, _ := newTestServer(t, map[string]string{
		"SHOP_MYSQL_DSN": shoptest.MySQL(t), "SHOP_REDIS_ADDRS": addr, "SHOP_KEY_PREFIX": prefix,
		"SHOP_STOCK_COMBINE": "8", "SHOP_CRITICAL_SECTION_DELAY": delay.String(),
	})
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	c := newContract(t, srv.URL)
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/reset", token: testAdmin, status: 200})
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/products", token: testAdmin, status: 201,
		body: `{"sku":"batch-dup","name":"Batch item","stock":10,"price_cents":100}`})
	const path, body = "/api/v1/seckill/batch-dup/purchase", `{"quantity":1}`
	u1, u2 := shoptestToken(t, 1), shoptestToken(t, 2)
	key, other := randomKey(), randomKey()
	sum := sha256.Sum256([]byte(key))
	rec := fmt.Sprintf("%sidem:{1}:%s", prefix, hex.EncodeToString(sum[:16]))

	first := make(chan int, 1)
	go func() {
		res, _ := send(t, nil, srv, post{path, u1, key, body})
		first <- res.StatusCode
	}()
	for rdb.Exists(context.Background(), rec+":run").Val() == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(delay / 5) // the first is in its critical section
	rdb.Del(context.Background(), rec, rec+":run")

	var wg sync.WaitGroup
	var neighbour int
	var neighbourBody string
	wg.Add(2)
	go func() { defer wg.Done(); send(t, nil, srv, post{path, u1, key, body}) }()
	go func() {
		defer wg.Done()
		res, b := send(t, nil, srv, post{path, u2, other, body})
		neighbour, neighbourBody = res.StatusCode, b
	}()
	wg.Wait()
	if got := <-first; got != http.StatusCreated {
		t.Fatalf("the first purchase: %d", got)
	}
	if neighbour != http.StatusCreated {
		t.Errorf("the neighbour in the batch: %d %s; want 201", neighbour, neighbourBody)
	}
	again, againBody := send(t, nil, srv, post{path, u2, other, body})
	if again.StatusCode != http.StatusCreated {
		t.Errorf("the neighbour's retry: %d %s; want its sale", again.StatusCode, againBody)
	}
	retry, retryBody := send(t, nil, srv, post{path, u1, key, body})
	if retry.StatusCode != http.StatusCreated {
		t.Errorf("the duplicate's retry: %d %s; want the first run's sale", retry.StatusCode, retryBody)
	}
	var p struct{ Stock int64 }
	_ = json.Unmarshal(c.run(t, srv, apiCase{method: "GET", path: "/api/v1/products/batch-dup", token: u1, status: 200}), &p)
	if p.Stock != 8 {
		t.Errorf("stock %d, want 8: one unit for each key", p.Stock)
	}
}

// TestAnOrderRetriedAfterRedisLostItsTokenReplays: an order placed and
// paid with a minted token; Redis then loses the token (a restart without
// persistence, a failover), and the client retries, as a 503
// outcome-unknown tells it to. The retry must answer the order that
// committed, not "unknown key, mint a new one", whose new order would
// take the money a second time, with every header the first answer had
// (its Location names the order).
func TestAnOrderRetriedAfterRedisLostItsTokenReplays(t *testing.T) {
	addr := shoptest.Env(t, "SHOP_TEST_REDIS_ADDR")
	prefix := shoptest.Prefix("idemorder")
	srv, _ := newTestServer(t, map[string]string{
		"SHOP_MYSQL_DSN": shoptest.MySQL(t), "SHOP_REDIS_ADDRS": addr, "SHOP_KEY_PREFIX": prefix,
	})
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	c := newContract(t, srv.URL)
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/reset", token: testAdmin, status: 200})
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/products", token: testAdmin, status: 201,
		body: `{"sku":"order-lost","name":"Order item","stock":10,"price_cents":100}`})
	u1 := shoptestToken(t, 1)
	var tok struct {
		Token string `json:"token"`
	}
	_ = json.Unmarshal(c.run(t, srv, apiCase{method: "POST", path: "/api/v1/idempotency-tokens", token: u1, status: 201}), &tok)
	const path, body = "/api/v1/orders", `{"sku":"order-lost","quantity":1,"pay":true}`
	first, firstBody := send(t, c, srv, post{path, u1, tok.Token, body})
	if first.StatusCode != http.StatusCreated {
		t.Fatalf("the order: %d %s", first.StatusCode, firstBody)
	}
	sum := sha256.Sum256([]byte(tok.Token))
	rec := fmt.Sprintf("%sidem:{1}:%s", prefix, hex.EncodeToString(sum[:16]))
	rdb.Del(context.Background(), rec, rec+":run")
	again, againBody := send(t, c, srv, post{path, u1, tok.Token, body})
	if again.StatusCode != http.StatusCreated || againBody != firstBody || again.Header.Get(idem.ReplayedHeader) != "true" {
		t.Fatalf("the retry after Redis lost the token: %d %s; want the first answer, %d %s, replayed",
			again.StatusCode, againBody, first.StatusCode, firstBody)
	}
	if first.Header.Get("Location") == "" {
		t.Fatal("the order was answered without a Location")
	}
	for _, h := range []string{"Content-Type", "Location", "Cache-Control"} {
		if got, want := again.Header.Get(h), first.Header.Get(h); got != want {
			t.Errorf("the retry after Redis lost the token: %s %q, want the first answer's %q", h, got, want)
		}
	}
	other, _ := send(t, c, srv, post{path, u1, tok.Token, `{"sku":"order-lost","quantity":2,"pay":true}`})
	if other.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("another request with the token: %d, want 422", other.StatusCode)
	}
}

// TestAnAdminResetDeletesTheIdempotencyRecords: a reset empties the
// orders, so the records of their keys go too; a token whose order was
// reset away, retried once Redis has lost it, is unknown rather than
// answered with an order that no longer exists.
func TestAnAdminResetDeletesTheIdempotencyRecords(t *testing.T) {
	addr := shoptest.Env(t, "SHOP_TEST_REDIS_ADDR")
	prefix := shoptest.Prefix("idemreset")
	srv, _ := newTestServer(t, map[string]string{
		"SHOP_MYSQL_DSN": shoptest.MySQL(t), "SHOP_REDIS_ADDRS": addr, "SHOP_KEY_PREFIX": prefix,
	})
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	t.Cleanup(func() { rdb.Close() })
	c := newContract(t, srv.URL)
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/reset", token: testAdmin, status: 200})
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/products", token: testAdmin, status: 201,
		body: `{"sku":"reset-item","name":"Reset item","stock":10,"price_cents":100}`})
	u1 := shoptestToken(t, 1)
	var tok struct {
		Token string `json:"token"`
	}
	_ = json.Unmarshal(c.run(t, srv, apiCase{method: "POST", path: "/api/v1/idempotency-tokens", token: u1, status: 201}), &tok)
	const path, body = "/api/v1/orders", `{"sku":"reset-item","quantity":1}`
	if first, b := send(t, c, srv, post{path, u1, tok.Token, body}); first.StatusCode != http.StatusCreated {
		t.Fatalf("the order: %d %s", first.StatusCode, b)
	}
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/reset", token: testAdmin, status: 200})
	sum := sha256.Sum256([]byte(tok.Token))
	rec := fmt.Sprintf("%sidem:{1}:%s", prefix, hex.EncodeToString(sum[:16]))
	rdb.Del(context.Background(), rec, rec+":run")
	retry, retryBody := send(t, c, srv, post{path, u1, tok.Token, body})
	if retry.StatusCode != http.StatusUnprocessableEntity || !strings.Contains(retryBody, "idempotency-key-unknown") {
		t.Fatalf("the retry after the reset: %d %s; want 422 idempotency-key-unknown", retry.StatusCode, retryBody)
	}
}
