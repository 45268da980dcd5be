package faults

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/shoptest"
)

// commitCutter sits between shop and MariaDB. Once armed, it forwards the
// next COMMIT to the server and cuts the connection when the server's OK
// comes back, before the client reads it: the change is committed and the
// client cannot know.
type commitCutter struct {
	t *testing.T
	// armed counts down the COMMITs until the one to cut (1: the next).
	armed atomic.Int32
}

// newCommitCutter starts the proxy in front of the server of dsn and
// returns the DSN that goes through it.
func newCommitCutter(t *testing.T, dsn string) (*commitCutter, string) {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c := &commitCutter{t: t}
	server := cfg.Addr
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go c.forward(client, server)
		}
	}()
	cfg.Addr = ln.Addr().String()
	return c, cfg.FormatDSN()
}

// arm cuts the nth COMMIT any connection sends from now on.
func (c *commitCutter) arm(nth int32) { c.armed.Store(nth) }

// cutThis counts one COMMIT and reports whether it is the one to cut.
func (c *commitCutter) cutThis() bool {
	for {
		n := c.armed.Load()
		if n <= 0 {
			return false
		}
		if c.armed.CompareAndSwap(n, n-1) {
			return n == 1
		}
	}
}

func (c *commitCutter) forward(client net.Conn, addr string) {
	server, err := net.Dial("tcp", addr)
	if err != nil {
		client.Close()
		return
	}
	var cut atomic.Bool
	var once sync.Once
	closeBoth := func() { once.Do(func() { client.Close(); server.Close() }) }
	go func() { // server to client: dropped, and the line cut, once a COMMIT went out
		defer closeBoth()
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			if cut.Load() {
				return
			}
			if n > 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer closeBoth()
	wroteBusinessRow := false
	for { // client to server, packet by packet: 3 bytes of length, 1 of sequence
		var head [4]byte
		if _, err := io.ReadFull(client, head[:]); err != nil {
			return
		}
		payload := make([]byte, int(binary.LittleEndian.Uint32(append(head[:3:3], 0))))
		if _, err := io.ReadFull(client, payload); err != nil {
			return
		}
		// COM_QUERY (0x03) "COMMIT": the driver's Commit. Only the COMMIT
		// of a transaction that wrote a business row counts: the
		// service's background loops (the event relay's claim, the
		// pruners) commit their own transactions at any moment.
		switch {
		case isQuery(payload, "COMMIT"):
			if wroteBusinessRow && c.cutThis() {
				cut.Store(true)
			}
			wroteBusinessRow = false
		case isQuery(payload, "START TRANSACTION"), isQuery(payload, "ROLLBACK"):
			// A write outside this transaction (autocommitted, or rolled
			// back) says nothing of the COMMIT that ends it.
			wroteBusinessRow = false
		case writesBusinessRow(payload):
			wroteBusinessRow = true
		}
		if _, err := server.Write(append(head[:], payload...)); err != nil {
			return
		}
	}
}

// isQuery reports whether payload is the query (COM_QUERY, 0x03) q.
func isQuery(payload []byte, q string) bool {
	return len(payload) > 1 && payload[0] == 0x03 && strings.EqualFold(string(payload[1:]), q)
}

// businessTables are the tables a money-moving request writes.
var businessTables = regexp.MustCompile("(?i)^(INSERT INTO|UPDATE) `?(accounts|ledger_entries|products|purchases|purchase_limits|orders)`? ")

// writesBusinessRow reports whether a query (COM_QUERY 0x03) or a
// statement being prepared (COM_STMT_PREPARE 0x16) writes one of them.
func writesBusinessRow(payload []byte) bool {
	return len(payload) > 1 && (payload[0] == 0x03 || payload[0] == 0x16) && businessTables.Match(payload[1:])
}

// commitRig is a shop process on a database behind a commitCutter, and
// the Redis that holds its idempotency records.
type commitRig struct {
	*rig
	cutter *commitCutter
	redis  *redis.Client
	url    string
}

func newCommitRig(t *testing.T, env map[string]string) *commitRig {
	t.Helper()
	cutter, dsn := newCommitCutter(t, shoptest.MySQL(t))
	full := lockEnv(t, "redis")
	full["SHOP_MYSQL_DSN"] = dsn
	for k, v := range env {
		full[k] = v
	}
	r := newRig(t, full)
	in := r.start()
	rdb := redis.NewClient(&redis.Options{Addr: shoptest.Env(t, "SHOP_TEST_REDIS_ADDR")})
	t.Cleanup(func() { rdb.Close() })
	return &commitRig{rig: r, cutter: cutter, redis: rdb, url: in.URL}
}

// forget deletes the Redis record of user's key, as a Redis restart
// without persistence or a failover before replication would.
func (r *commitRig) forget(user int64, key string) {
	r.t.Helper()
	sum := sha256.Sum256([]byte(key))
	rec := fmt.Sprintf("%sidem:{%d}:%s", r.env["SHOP_KEY_PREFIX"], user, hex.EncodeToString(sum[:16]))
	if err := r.redis.Del(context.Background(), rec, rec+":run").Err(); err != nil {
		r.t.Fatal(err)
	}
}

// cutThenRetry sends a keyed request whose COMMIT's reply is cut, expects
// 503 outcome-unknown, optionally makes Redis forget the key, and retries
// it with the same key until it settles. It returns the settled answer.
func (r *commitRig) cutThenRetry(user int64, path, body string, forget bool) (int, []byte, http.Header) {
	r.t.Helper()
	key := "cut-" + shoptest.Random(8)
	r.cutter.arm(1)
	status, b, err := r.send(context.Background(), "POST", r.url+path, r.token(user), key, body)
	r.mustBeOutcomeUnknown(path, status, b, err)
	return r.retry(user, path, key, body, forget)
}

func (r *commitRig) mustBeOutcomeUnknown(path string, status int, b []byte, err error) {
	r.t.Helper()
	if err != nil || status != http.StatusServiceUnavailable || !strings.Contains(string(b), "outcome-unknown") {
		r.t.Fatalf("POST %s with its COMMIT cut: %d %s %v; want 503 outcome-unknown", path, status, b, err)
	}
	var p problem.Details
	_ = json.Unmarshal(b, &p)
	if !strings.Contains(p.Detail, "same key") {
		r.t.Errorf("the keyed 503's detail does not send the client to retry with its key: %q", p.Detail)
	}
}

// retry sends the request with key again, after making Redis forget the
// key if asked.
func (r *commitRig) retry(user int64, path, key, body string, forget bool) (int, []byte, http.Header) {
	r.t.Helper()
	if forget {
		r.forget(user, key)
	}
	tok := r.token(user)
	req, _ := http.NewRequest("POST", r.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	res, err := r.client.HTTP.Do(req)
	if err != nil {
		r.t.Fatal(err)
	}
	defer res.Body.Close()
	rb, _ := io.ReadAll(res.Body)
	return res.StatusCode, rb, res.Header
}

// balance and stock read what the database holds, through the API.
func (r *commitRig) balance(id int64) int64 {
	r.t.Helper()
	var a struct {
		BalanceCents int64 `json:"balance_cents"`
	}
	r.client.Must(r.t, http.StatusOK, "GET", fmt.Sprintf("%s/api/v1/accounts/%d", r.url, id), r.token(id), nil).JSON(r.t, &a)
	return a.BalanceCents
}

func (r *commitRig) stock(sku string) int64 {
	r.t.Helper()
	var p struct{ Stock int64 }
	r.client.Must(r.t, http.StatusOK, "GET", r.url+"/api/v1/products/"+sku, r.token(buyer), nil).JSON(r.t, &p)
	return p.Stock
}

func (r *commitRig) mustReplay(what string, status, want int, b []byte, h http.Header) {
	r.t.Helper()
	if status != want || h.Get("Idempotent-Replayed") != "true" {
		r.t.Fatalf("%s: retry answered %d (replayed %q) %s; want the first outcome, %d, replayed", what, status,
			h.Get("Idempotent-Replayed"), b, want)
	}
}

var recordStates = []struct {
	name   string
	forget bool
}{{"redis record intact", false}, {"redis record deleted", true}}

// TestKeyedMoneyMovesOnceWhenCommitReplyIsLost cuts the database's answer
// to the COMMIT of each money-moving request; the client gets 503
// outcome-unknown and retries with the same key, once with the key's Redis
// record intact and once after Redis lost it. Every retry answers the
// first outcome; money and stock moved once; the audit is clean.
func TestKeyedMoneyMovesOnceWhenCommitReplyIsLost(t *testing.T) {
	t.Parallel()
	t.Run("accounts", func(t *testing.T) { t.Parallel(); cutAccounts(t) })
	strategies := map[string]map[string]string{"lock": {}}
	if full() {
		strategies["atomic-sql"] = map[string]string{"SHOP_STOCK_STRATEGY": "atomic-sql"}
		strategies["atomic-redis"] = map[string]string{"SHOP_STOCK_STRATEGY": "atomic-redis"}
		strategies["optimistic"] = map[string]string{"SHOP_STOCK_STRATEGY": "optimistic"}
		strategies["combined"] = map[string]string{"SHOP_STOCK_COMBINE": "8"}
		t.Run("purchase combined batch", func(t *testing.T) { t.Parallel(); cutBatch(t) })
	}
	for name, env := range strategies {
		t.Run("purchase "+name, func(t *testing.T) { t.Parallel(); cutPurchase(t, env) })
	}
	t.Run("pay", func(t *testing.T) { t.Parallel(); cutPay(t) })
}

func cutAccounts(t *testing.T) {
	r := newCommitRig(t, nil)
	const other = int64(2)
	r.account(r.url, buyer, opening)
	r.account(r.url, other, opening)
	want, wantOther := int64(opening), int64(opening)
	for _, s := range recordStates {
		status, b, h := r.cutThenRetry(buyer, fmt.Sprintf("/api/v1/accounts/%d/deposit", buyer), `{"amount_cents":250}`, s.forget)
		r.mustReplay("deposit, "+s.name, status, http.StatusOK, b, h)
		want += 250
		status, b, h = r.cutThenRetry(buyer, fmt.Sprintf("/api/v1/accounts/%d/withdraw", buyer), `{"amount_cents":100}`, s.forget)
		r.mustReplay("withdraw, "+s.name, status, http.StatusOK, b, h)
		want -= 100
		status, b, h = r.cutThenRetry(buyer, "/api/v1/transfers", fmt.Sprintf(`{"from":%d,"to":%d,"amount_cents":40}`, buyer, other), s.forget)
		r.mustReplay("transfer, "+s.name, status, http.StatusOK, b, h)
		want, wantOther = want-40, wantOther+40
		if got, gotOther := r.balance(buyer), r.balance(other); got != want || gotOther != wantOther {
			t.Fatalf("%s: balances %d and %d, want %d and %d: each change once", s.name, got, gotOther, want, wantOther)
		}
	}
	a := r.mustAuditOK(r.url)
	report(row{Fault: "9 commit reply lost", Backend: "redis", LostCents: a.Totals["balance_drift"],
		Stale: "deposit, withdraw, transfer: each keyed retry replayed, moved once"})
}

func cutPurchase(t *testing.T, env map[string]string) {
	r := newCommitRig(t, env)
	const sku, stock = "cut-sku", 10
	r.product(r.url, sku, stock)
	want := int64(stock)
	for _, s := range recordStates {
		status, b, h := r.cutThenRetry(buyer, "/api/v1/seckill/"+sku+"/purchase", `{"quantity":1}`, s.forget)
		r.mustReplay("purchase, "+s.name, status, http.StatusCreated, b, h)
		want--
		if got := r.stock(sku); got != want {
			t.Fatalf("%s: stock %d, want %d: one unit per purchase", s.name, got, want)
		}
	}
	a := r.mustAuditOK(r.url)
	strategy := env["SHOP_STOCK_STRATEGY"]
	if env["SHOP_STOCK_COMBINE"] != "" {
		strategy = "lock, combined"
	}
	report(row{Fault: "9 commit reply lost", Backend: "redis", Oversold: a.Totals["oversold_units"],
		Stale: "purchase (" + shoptestOr(strategy, "lock") + "): each keyed retry replayed, one unit"})
}

func shoptestOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func cutPay(t *testing.T) {
	r := newCommitRig(t, nil)
	r.account(r.url, buyer, opening)
	r.orderProduct(r.url)
	tok := r.token(buyer)
	for _, s := range recordStates {
		status, b, err := r.send(context.Background(), "POST", r.url+"/api/v1/orders", tok, r.idemKey(r.url, tok),
			`{"sku":"`+orderSKU+`","quantity":1}`)
		var o placed
		if err != nil || status != http.StatusCreated || json.Unmarshal(b, &o) != nil {
			t.Fatalf("place: %d %s %v", status, b, err)
		}
		status, b, _ = r.cutThenRetry(buyer, fmt.Sprintf("/api/v1/orders/%d/pay", o.ID), "", s.forget)
		if status != http.StatusOK || !strings.Contains(string(b), `"paid"`) {
			t.Fatalf("pay, %s: retry answered %d %s; want the paid order", s.name, status, b)
		}
	}
	if got, want := r.balance(buyer), int64(opening-2*orderPrice); got != want {
		t.Fatalf("balance %d, want %d: each order paid once", got, want)
	}
	a := r.mustAuditOK(r.url)
	report(row{Fault: "9 commit reply lost", Backend: "redis", LostCents: a.Totals["unreconciled_order_cents"],
		Stale: "pay: each keyed retry found the order paid"})
}

// cutBatch cuts the COMMIT of a combined batch of two buyers: the first
// buyer holds the stock lock for its critical section while the other two
// queue behind it and are then served together. Both are told 503; each
// retry with its key (one after Redis forgot it) answers its sale.
func cutBatch(t *testing.T) {
	// A long section, so that the others surely arrive while the first
	// buyer is in it, however slow the machine.
	const delay = time.Second
	r := newCommitRig(t, map[string]string{"SHOP_STOCK_COMBINE": "8", "SHOP_CRITICAL_SECTION_DELAY": delay.String()})
	const sku, stock, path = "cut-batch", 10, "/api/v1/seckill/cut-batch/purchase"
	r.product(r.url, sku, stock)
	users := []int64{1, 2, 3}
	keys := []string{"first-" + shoptest.Random(8), "b-" + shoptest.Random(8), "c-" + shoptest.Random(8)}
	type answer struct {
		status int
		body   []byte
		err    error
	}
	answers := make([]answer, len(users))
	r.cutter.arm(2) // the first buyer's COMMIT lands; the batch's is cut
	var wg sync.WaitGroup
	for i := range users {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := &answers[i]
			a.status, a.body, a.err = r.send(context.Background(), "POST", r.url+path, r.token(users[i]), keys[i], `{"quantity":1}`)
		}()
		if i == 0 {
			time.Sleep(delay / 5) // the others queue while the first is served
		}
	}
	wg.Wait()
	if answers[0].status != http.StatusCreated {
		t.Fatalf("the first buyer: %d %s %v", answers[0].status, answers[0].body, answers[0].err)
	}
	for i := 1; i < len(users); i++ {
		r.mustBeOutcomeUnknown(path, answers[i].status, answers[i].body, answers[i].err)
		status, b, h := r.retry(users[i], path, keys[i], `{"quantity":1}`, i == 2)
		r.mustReplay(fmt.Sprintf("buyer %d of the cut batch", users[i]), status, http.StatusCreated, b, h)
	}
	if got := r.stock(sku); got != stock-3 {
		t.Fatalf("stock %d, want %d: one unit per buyer", got, stock-3)
	}
	a := r.mustAuditOK(r.url)
	report(row{Fault: "9 commit reply lost", Backend: "redis", Oversold: a.Totals["oversold_units"],
		Stale: "purchase (lock, combined batch of 2): both buyers' keyed retries replayed, one unit each"})
}

// TestAnOrderWhoseCommitReplyIsLostDropsTheStockMirror: with atomic-redis
// the mirror counts the stock; an order reserves units past it and must
// drop it once its transaction may have committed, also when the COMMIT's
// reply was lost: a mirror left as it was would count the reserved units
// as still for sale, and the audit at rest would see it drift.
func TestAnOrderWhoseCommitReplyIsLostDropsTheStockMirror(t *testing.T) {
	t.Parallel()
	r := newCommitRig(t, map[string]string{"SHOP_STOCK_STRATEGY": "atomic-redis"})
	r.account(r.url, buyer, opening)
	r.orderProduct(r.url)
	tok := r.token(buyer)
	// A sale loads the mirror.
	if status, b, err := r.send(context.Background(), "POST", r.url+"/api/v1/seckill/"+orderSKU+"/purchase", tok, "",
		`{"quantity":1}`); err != nil || status != http.StatusCreated {
		t.Fatalf("purchase: %d %s %v", status, b, err)
	}
	key := r.idemKey(r.url, tok)
	const body = `{"sku":"` + orderSKU + `","quantity":1,"pay":true}`
	r.cutter.arm(1)
	status, b, err := r.send(context.Background(), "POST", r.url+"/api/v1/orders", tok, key, body)
	r.mustBeOutcomeUnknown("/api/v1/orders", status, b, err)
	status, b, h := r.retry(buyer, "/api/v1/orders", key, body, false)
	r.mustReplay("order", status, http.StatusCreated, b, h)
	if got, want := r.stock(orderSKU), int64(orderStock-2); got != want {
		t.Fatalf("stock %d, want %d", got, want)
	}
	r.mustAuditOK(r.url)
}

// TestARestockWhoseCommitReplyIsLostDropsTheStockMirror: an admin put
// replaces a product's stock past the atomic-redis mirror; when its
// COMMIT's reply is lost the put may have landed, and the mirror must
// still be dropped, or it keeps selling the old stock and the audit at
// rest sees it drift.
func TestARestockWhoseCommitReplyIsLostDropsTheStockMirror(t *testing.T) {
	t.Parallel()
	r := newCommitRig(t, map[string]string{"SHOP_STOCK_STRATEGY": "atomic-redis"})
	const sku = "cut-restock"
	r.product(r.url, sku, 10)
	tok := r.token(buyer)
	// A sale loads the mirror.
	if status, b, err := r.send(context.Background(), "POST", r.url+"/api/v1/seckill/"+sku+"/purchase", tok, "",
		`{"quantity":1}`); err != nil || status != http.StatusCreated {
		t.Fatalf("purchase: %d %s %v", status, b, err)
	}
	r.cutter.arm(1)
	status, b, err := r.send(context.Background(), "POST", r.url+"/admin/v1/products", r.admin, "",
		`{"sku":"`+sku+`","name":"`+sku+`","stock":100,"price_cents":1}`)
	if err != nil || status != http.StatusServiceUnavailable {
		t.Fatalf("the put with its COMMIT cut: %d %s %v; want 503", status, b, err)
	}
	if got := r.stock(sku); got != 100 {
		t.Fatalf("stock %d, want 100: the put landed", got)
	}
	r.mustAuditOK(r.url)
}
