package faults

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/shoptest"
)

// The order faults: a shop process stopped in the middle of an order
// (SIGTERM with a shutdown timeout shorter than the critical section, and
// SIGKILL), a client that hangs up at each moment of an order, and the
// closer's leader paused past its lease while another instance takes over.
// In every case the audit ends clean and a retry with the same key
// converges to one order.

const (
	sigTerm = syscall.SIGTERM

	orderSKU   = "fault-order"
	orderPrice = 100
	orderStock = 50
	buyer      = int64(1)
)

// orderChecks are the audit's order reconciliation members.
var orderChecks = []string{"duplicate_orders", "unreconciled_order_cents", "unreconciled_order_units",
	"miscounted_order_records", "paid_and_cancelled_orders", "stock_returned_twice", "stuck_orders"}

// orderAudit is the audit, every member by name.
type orderAudit struct {
	OK     bool
	Totals map[string]int64
	Raw    string
}

func (r *rig) orderAudit(url string) orderAudit {
	r.t.Helper()
	a := r.audit(url) // waits out a 503
	res, err := r.client.Do(context.Background(), "GET", url+"/admin/v1/audit", r.admin, nil)
	if err != nil || res.Status != http.StatusOK {
		r.t.Fatalf("audit: %v %d", err, res.Status)
	}
	var m map[string]json.RawMessage
	res.JSON(r.t, &m)
	out := orderAudit{OK: a.OK, Totals: map[string]int64{}, Raw: string(res.Body)}
	_ = json.Unmarshal(m["ok"], &out.OK)
	for name, raw := range m {
		var d struct{ Total *int64 }
		if json.Unmarshal(raw, &d) == nil && d.Total != nil {
			out.Totals[name] = *d.Total
		}
	}
	for _, name := range orderChecks {
		if _, ok := out.Totals[name]; !ok {
			r.t.Fatalf("the audit has no %s: %s", name, res.Body)
		}
	}
	return out
}

func (r *rig) mustAuditOK(url string) orderAudit {
	r.t.Helper()
	a := r.orderAudit(url)
	if !a.OK {
		r.t.Fatalf("audit not ok: %s", a.Raw)
	}
	return a
}

func (r *rig) orderProduct(url string) {
	r.t.Helper()
	r.client.Must(r.t, http.StatusCreated, "POST", url+"/admin/v1/products", r.admin,
		map[string]any{"sku": orderSKU, "name": orderSKU, "stock": orderStock, "price_cents": orderPrice})
}

// send is one request with an optional Idempotency-Key.
func (r *rig) send(ctx context.Context, method, url, token, key, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	res, err := r.client.HTTP.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, b, err
}

func (r *rig) idemKey(url, token string) string {
	r.t.Helper()
	res := r.client.Must(r.t, http.StatusCreated, "POST", url+"/api/v1/idempotency-tokens", token, nil)
	var tok struct{ Token string }
	res.JSON(r.t, &tok)
	return tok.Token
}

type placed struct {
	ID     int64  `json:"id"`
	Status string `json:"status"`
}

// retryUntilSettled sends the request again until it is no longer answered
// 409 (the first run's in-flight marker outlives a dead process by its
// lease) or 503, and returns the settled answer.
func (r *rig) retryUntilSettled(method, url, token, key, body string) (int, []byte) {
	r.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		status, b, err := r.send(context.Background(), method, url, token, key, body)
		if err == nil && status != http.StatusConflict && status < 500 {
			return status, b
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("retry did not settle in 90s: %d %s %v", status, b, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// ordersOf counts the buyer's orders and their statuses.
func (r *rig) ordersOf(url, token string) map[string]int {
	r.t.Helper()
	status, b, err := r.send(context.Background(), "GET", url+"/api/v1/orders?limit=100", token, "", "")
	if err != nil || status != http.StatusOK {
		r.t.Fatalf("list orders: %d %s %v", status, b, err)
	}
	var page struct{ Orders []placed }
	if err := json.Unmarshal(b, &page); err != nil {
		r.t.Fatal(err)
	}
	out := map[string]int{}
	for _, o := range page.Orders {
		out[o.Status]++
	}
	return out
}

// inCriticalSection waits until in holds the stock lock of an order
// (its grants of class stock reach want), then a quarter of the section.
func (r *rig) inCriticalSection(in *shoptest.Instance, class string, want float64, delay time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		v, err := r.metric(in.URL, "shop_lock_wait_seconds_count", `class="`+class+`"`)
		if err == nil && v >= want {
			time.Sleep(delay / 4)
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s took no %s lock within 30s", in.URL, class)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOrderProcessStopped stops the shop process that is placing and
// paying an order, half-way through its critical section: SIGTERM with a
// shutdown timeout shorter than that section, or SIGKILL. A new process
// on the same database finds either no trace of the order or all of it;
// the retry with the same key places it once.
func TestOrderProcessStopped(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		sig  string
	}{{"sigterm", "TERM"}, {"sigkill", "KILL"}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const delay = 2 * time.Second
			env := lockEnv(t, "redis")
			env["SHOP_CRITICAL_SECTION_DELAY"] = delay.String()
			env["SHOP_SHUTDOWN_TIMEOUT"] = "300ms"
			// No drain delay: the handler must be cut mid-order, not given
			// the time to finish.
			env["SHOP_DRAIN_DELAY"] = "0s"
			r := newRig(t, env)
			a := r.start()
			r.account(a.URL, buyer, opening)
			r.orderProduct(a.URL)
			tok := r.token(buyer)
			key := r.idemKey(a.URL, tok)
			const body = `{"sku":"` + orderSKU + `","quantity":3,"pay":true}`

			type answer struct {
				status int
				body   []byte
				err    error
			}
			first := make(chan answer, 1)
			go func() {
				s, b, err := r.send(context.Background(), "POST", a.URL+"/api/v1/orders", tok, key, body)
				first <- answer{s, b, err}
			}()
			r.inCriticalSection(a, "stock", 1, delay)
			sig := sigKill
			if tc.sig == "TERM" {
				sig = sigTerm
			}
			if err := a.Signal(sig); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			_ = a.Wait(ctx)
			cancel()
			got := <-first
			t.Logf("the stopped process answered %d %s %v", got.status, got.body, got.err)

			b := r.start()
			mid := r.mustAuditOK(b.URL)
			status, answerBody := r.retryUntilSettled("POST", b.URL+"/api/v1/orders", tok, key, body)
			var o placed
			_ = json.Unmarshal(answerBody, &o)
			if status != http.StatusCreated || o.Status != "paid" {
				t.Fatalf("retry: %d %s; want 201 paid", status, answerBody)
			}
			if n := r.ordersOf(b.URL, tok); n["paid"] != 1 || len(n) != 1 {
				t.Fatalf("orders after the retry: %v; want one paid", n)
			}
			end := r.mustAuditOK(b.URL)
			var acct struct {
				Balance int64 `json:"balance_cents"`
			}
			r.client.Must(t, http.StatusOK, "GET", fmt.Sprintf("%s/api/v1/accounts/%d", b.URL, buyer), tok, nil).JSON(t, &acct)
			if acct.Balance != opening-3*orderPrice {
				t.Fatalf("balance %d; want %d: one debit", acct.Balance, opening-3*orderPrice)
			}
			report(row{Fault: "7 order: process " + tc.name + " mid-order", Backend: "redis",
				LostCents: mid.Totals["unreconciled_order_cents"] + end.Totals["unreconciled_order_cents"],
				Oversold:  end.Totals["oversold_units"], Stale: fmt.Sprintf("first answer %d; retry 201 paid, 1 order", got.status)})
		})
	}
}

// TestOrderClientHangsUp sends an order and drops the connection at
// moments across its critical section, each with its own key; every retry
// converges to one paid order, and the audit stays clean.
func TestOrderClientHangsUp(t *testing.T) {
	t.Parallel()
	const delay = 600 * time.Millisecond
	env := lockEnv(t, "redis")
	env["SHOP_CRITICAL_SECTION_DELAY"] = delay.String()
	r := newRig(t, env)
	a := r.start()
	r.account(a.URL, buyer, opening)
	r.orderProduct(a.URL)
	tok := r.token(buyer)
	moments := []time.Duration{5 * time.Millisecond, 50 * time.Millisecond, delay / 2, delay - 20*time.Millisecond, delay + 20*time.Millisecond}
	if full() {
		for d := 100 * time.Millisecond; d < delay+200*time.Millisecond; d += 100 * time.Millisecond {
			moments = append(moments, d)
		}
	}
	const body = `{"sku":"` + orderSKU + `","quantity":1,"pay":true}`
	for _, after := range moments {
		key := r.idemKey(a.URL, tok)
		ctx, cancel := context.WithTimeout(context.Background(), after)
		_, _, _ = r.send(ctx, "POST", a.URL+"/api/v1/orders", tok, key, body)
		cancel()
		r.mustAuditOK(a.URL)
		status, b := r.retryUntilSettled("POST", a.URL+"/api/v1/orders", tok, key, body)
		if status != http.StatusCreated {
			t.Fatalf("hang-up after %s, retry: %d %s", after, status, b)
		}
	}
	if n := r.ordersOf(a.URL, tok); n["paid"] != len(moments) || len(n) != 1 {
		t.Fatalf("orders: %v; want %d paid", n, len(moments))
	}
	end := r.mustAuditOK(a.URL)
	report(row{Fault: "7 order: client hangs up", Backend: "redis", LostCents: end.Totals["unreconciled_order_cents"],
		Stale: fmt.Sprintf("%d hang-ups, each retry one paid order", len(moments))})
}

// TestOrderCloserLeaderPaused pauses the closer's leader with SIGSTOP in
// the middle of cancelling an order, past its leader lease and its row
// lease; the other instance takes the lease and closes every order. When
// the paused one resumes, its stale close is stopped (lease lost) or
// refused by the fence. Every order ends cancelled once, its stock back.
func TestOrderCloserLeaderPaused(t *testing.T) {
	t.Parallel()
	backends := []string{"redis"}
	if full() {
		backends = []string{"redis", "mysql", "zookeeper", "etcd"}
	}
	for _, backend := range backends {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			closerPaused(t, backend)
		})
	}
}

func closerPaused(t *testing.T, backend string) {
	const delay = 700 * time.Millisecond
	env := lockEnv(t, backend)
	env["SHOP_ORDER_PAY_TIMEOUT"] = "1s"
	env["SHOP_LOCK_TTL"] = holderTTL.String()
	env["SHOP_CRITICAL_SECTION_DELAY"] = delay.String()
	r := newRig(t, env)
	a := r.start()
	r.account(a.URL, buyer, opening)
	r.orderProduct(a.URL)
	waitLog(t, a, "order closer: leading")
	b := r.start()
	tok := r.token(buyer)
	const orders = 4
	for range orders {
		key := r.idemKey(a.URL, tok)
		if s, body, err := r.send(context.Background(), "POST", a.URL+"/api/v1/orders", tok, key,
			`{"sku":"`+orderSKU+`","quantity":2}`); err != nil || s != http.StatusCreated {
			t.Fatalf("place: %d %s %v", s, body, err)
		}
	}
	// The leader takes lock:order:<id> to close the first order: pause it
	// a quarter into that close.
	r.inCriticalSection(a, "order", 1, delay)
	if err := a.Signal(sigStop); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	waitLog(t, b, "order closer: leading")
	deadline := time.Now().Add(60 * time.Second)
	for r.ordersOf(b.URL, tok)["cancelled"] < orders {
		if time.Now().After(deadline) {
			t.Fatalf("the new leader did not close every order: %v", r.ordersOf(b.URL, tok))
		}
		time.Sleep(100 * time.Millisecond)
	}
	takeover := time.Since(paused)
	if err := a.Signal(sigCont); err != nil {
		t.Fatal(err)
	}
	// The resumed process finds its leases gone: give its watchdog and its
	// stale transaction time to act, then audit.
	waitLog(t, a, "order closer: stepped down")
	time.Sleep(2 * holderTTL)
	end := r.mustAuditOK(b.URL)
	if n := r.ordersOf(b.URL, tok); n["cancelled"] != orders || len(n) != 1 {
		t.Fatalf("orders: %v; want %d cancelled", n, orders)
	}
	fenced, _ := r.metric(a.URL, "shop_fenced_writes_total", `class="order"`)
	stale := "stopped (lease lost) before writing"
	if fenced > 0 {
		stale = fmt.Sprintf("%d stale close refused by the fence", int(fenced))
	}
	report(row{Fault: "7 order: closer leader paused", Backend: backend, Fenced: int(fenced),
		LostCents: end.Totals["unreconciled_order_cents"], Recovery: takeover, Stale: stale})
}

// TestOrderCloserWithoutLock runs the closer on three processes with the
// none backend: every one of them leads, and the audit shows stock
// returned more than once.
func TestOrderCloserWithoutLock(t *testing.T) {
	t.Parallel()
	env := map[string]string{"SHOP_LOCK_BACKEND": "none", "SHOP_ORDER_PAY_TIMEOUT": "1s",
		"SHOP_CRITICAL_SECTION_DELAY": "300ms", "SHOP_REDIS_ADDRS": shoptest.Env(t, "SHOP_TEST_REDIS_ADDR")}
	r := newRig(t, env)
	a := r.start()
	r.account(a.URL, buyer, opening)
	r.orderProduct(a.URL)
	r.start()
	r.start()
	tok := r.token(buyer)
	const orders = 4
	for range orders {
		key := r.idemKey(a.URL, tok)
		if s, body, err := r.send(context.Background(), "POST", a.URL+"/api/v1/orders", tok, key,
			`{"sku":"`+orderSKU+`","quantity":1}`); err != nil || s != http.StatusCreated {
			t.Fatalf("place: %d %s %v", s, body, err)
		}
	}
	deadline := time.Now().Add(30 * time.Second)
	var got orderAudit
	for {
		time.Sleep(time.Second)
		got = r.orderAudit(a.URL)
		if got.Totals["stock_returned_twice"] > 0 || time.Now().After(deadline) {
			break
		}
	}
	if got.Totals["stock_returned_twice"] == 0 || got.OK {
		t.Fatalf("three closers without a lock returned no stock twice: %s", got.Raw)
	}
	report(row{Fault: "7 order: three closers, no lock", Backend: "none",
		Stale: fmt.Sprintf("stock returned twice: %d, unreconciled units %d", got.Totals["stock_returned_twice"],
			got.Totals["unreconciled_order_units"])})
}

// waitLog waits until in has logged msg.
func waitLog(t *testing.T, in *shoptest.Instance, msg string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !bytes.Contains([]byte(in.Logs()), []byte(`"msg":"`+msg+`"`)) {
		if time.Now().After(deadline) {
			t.Fatalf("%s did not log %q within 60s", in.URL, msg)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
