package main

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/shoptest"
)

// floodAnswers counts a flood's answers; shed are the 503s of type
// overloaded.
type floodAnswers struct {
	mu     sync.Mutex
	counts map[int]int
	shed   int
}

// TestFloodIsShedAndShedRequestsChangeNothing floods one instance on
// MariaDB and Redis, per stock strategy, with eight buyers per unit and a
// concurrency limit of at most 4: every answer is a sale, a sold-out 409 or
// a 503 with Retry-After; some are shed as overloaded; and the stock left,
// the sales and the audit agree, so a shed request sold nothing.
func TestFloodIsShedAndShedRequestsChangeNothing(t *testing.T) {
	strategies := map[string]map[string]string{
		"lock":         {"SHOP_STOCK_STRATEGY": "lock"},
		"atomic-sql":   {"SHOP_STOCK_STRATEGY": "atomic-sql"},
		"atomic-redis": {"SHOP_STOCK_STRATEGY": "atomic-redis"},
		"optimistic":   {"SHOP_STOCK_STRATEGY": "optimistic"},
		"combined":     {"SHOP_STOCK_STRATEGY": "lock", "SHOP_STOCK_COMBINE": "16"},
	}
	for name, env := range strategies {
		t.Run(name, func(t *testing.T) {
			env["SHOP_ADMISSION"] = "true"
			env["SHOP_ADMISSION_MIN_LIMIT"] = "2"
			env["SHOP_ADMISSION_MAX_LIMIT"] = "4"
			env["SHOP_CRITICAL_SECTION_DELAY"] = "5ms"
			floodOne(t, startCluster(t, 1, env))
		})
	}
}

func floodOne(t *testing.T, c *cluster) {
	const units, buyers = 50, 400
	c.client.Must(t, http.StatusCreated, "POST", c.urls[0]+"/admin/v1/products", c.admin,
		map[string]any{"sku": "flood", "name": "flood", "stock": units, "price_cents": 100})
	tokens := make([]string, buyers)
	for i := range tokens {
		tokens[i] = shoptest.Token(t, c.secret, int64(i+1))
	}
	a := floodAnswers{counts: map[int]int{}}
	var start, done sync.WaitGroup
	start.Add(1)
	for i := range buyers {
		done.Add(1)
		go func() {
			defer done.Done()
			start.Wait()
			r, err := c.client.Do(t.Context(), "POST", c.urls[0]+"/api/v1/seckill/flood/purchase", tokens[i], map[string]int{"quantity": 1})
			if err != nil {
				t.Error(err)
				return
			}
			a.record(t, r)
		}()
	}
	start.Done()
	done.Wait()

	sold := a.counts[http.StatusCreated]
	var p struct{ Stock int64 }
	c.client.Must(t, http.StatusOK, "GET", c.urls[0]+"/api/v1/products/flood", tokens[0], nil).JSON(t, &p)
	t.Logf("answers %v, %d of them shed; stock left %d", a.counts, a.shed, p.Stock)
	if a.shed == 0 {
		t.Errorf("no request of %d at once was shed under a concurrency limit of 4: %v", buyers, a.counts)
	}
	if int64(sold)+p.Stock != units {
		t.Errorf("%d sold and %d left of %d: a refused request changed the stock", sold, p.Stock, units)
	}
	if r := c.audit(t); !r.OK || r.OversoldUnits.Total != 0 {
		t.Errorf("audit after the flood: %+v, want ok", r)
	}
	if got := shedCounted(t, c); got != a.shed {
		t.Errorf("shop_admission_shed_total = %d, want the %d overloaded answers", got, a.shed)
	}
}

func (a *floodAnswers) record(t *testing.T, r shoptest.Response) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.counts[r.Status]++
	switch r.Status {
	case http.StatusCreated, http.StatusConflict:
		return
	case http.StatusServiceUnavailable:
	default:
		t.Errorf("status %d: %s; want 201, 409 or 503", r.Status, r.Body)
		return
	}
	if r.Header.Get("Retry-After") == "" {
		t.Errorf("503 without Retry-After: %s", r.Body)
	}
	var d problem.Details
	r.JSON(t, &d)
	if strings.HasSuffix(d.Type, "#overloaded") {
		a.shed++
		if ct := r.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/problem+json") {
			t.Errorf("shed answer has Content-Type %q, want application/problem+json", ct)
		}
	}
}

// shedCounted sums shop_admission_shed_total over every route.
func shedCounted(t *testing.T, c *cluster) int {
	r := c.client.Must(t, http.StatusOK, "GET", c.urls[0]+"/metrics", "", nil)
	total := 0
	sc := bufio.NewScanner(bytes.NewReader(r.Body))
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "shop_admission_shed_total{") {
			f := strings.Fields(line)
			n, err := strconv.ParseFloat(f[len(f)-1], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			total += int(n)
		}
	}
	return total
}

// TestShedRequestIsCountedAsShedAndNotLogged: a purchase refused at the
// concurrency limit is counted as shed, which the error alert
// (ShopHTTPErrors) leaves out, and writes no log line: a flood sheds
// thousands a second, and a line for each would cost more than the
// refusal.
func TestShedRequestIsCountedAsShedAndNotLogged(t *testing.T) {
	var logs syncBuffer
	send, metrics := atTheLimit(t, &logs)
	token := shoptest.Token(t, testSecret, 1)
	for range 5 {
		if code := send(t.Context(), purchasePath, token); code != http.StatusServiceUnavailable {
			t.Fatalf("purchase past the limit: %d, want 503", code)
		}
	}
	want := `shop_http_shed_total{method="POST",reason="overloaded",route="/api/v1/seckill/:sku/purchase"} 5`
	if m := metrics(); !strings.Contains(m, want) {
		t.Errorf("/metrics lacks %s", want)
	}
	if l := logs.String(); strings.Contains(l, `"status":503`) {
		t.Errorf("shed requests were logged:\n%s", l)
	}
}

// TestIdleBodiesNeitherBlockBuyersNorLowerTheLimit: one user opens more
// purchases than the route's limit, each with its headers and one byte of
// its body, and leaves them idle. Other buyers are served meanwhile, an
// unauthenticated caller gets 401 (not 503), and once the idle bodies are
// finished, rounds of them have not lowered the route's limit: a request
// takes its admission slot only after its caller is authenticated and
// its body is read, so the time a client takes to send it is neither a
// slot held nor latency the limiter steers by.
func TestIdleBodiesNeitherBlockBuyersNorLowerTheLimit(t *testing.T) {
	c := startCluster(t, 1, map[string]string{
		"SHOP_ADMISSION": "true",
		// Only the gradient against the route's own long-run latency may
		// move the limit, not a target the machine's speed decides.
		"SHOP_ADMISSION_TARGET": "1h",
		"SHOP_STOCK_STRATEGY":   "atomic-sql",
		// A floor under every purchase's latency, so that a loaded
		// machine's noise is small beside it.
		"SHOP_CRITICAL_SECTION_DELAY": "50ms",
	})
	const idle, buyers, rounds = 40, 20, 3 // idle > the initial limit of 32
	c.client.Must(t, http.StatusCreated, "POST", c.urls[0]+"/admin/v1/products", c.admin,
		map[string]any{"sku": "idle-hot", "name": "idle", "stock": 100000, "price_cents": 1})
	path := "/api/v1/seckill/idle-hot/purchase"
	buy := func(user int64) {
		t.Helper()
		c.client.Must(t, http.StatusCreated, "POST", c.urls[0]+path, shoptest.Token(t, c.secret, user), map[string]int{"quantity": 1})
	}
	// One window of purchases, one at a time as every later one is: the
	// route's long-run latency.
	for i := range buyers {
		buy(int64(i + 1))
	}
	before := admissionLimit(t, c, "/api/v1/seckill/:sku/purchase")

	slow := shoptest.Token(t, c.secret, 9999)
	for round := range rounds {
		conns := make([]*idlePurchase, idle)
		for i := range conns {
			conns[i] = startIdlePurchase(t, c.urls[0], path, slow)
		}
		// A request on another route, answered after the idle ones' headers
		// have most likely been read.
		c.client.Must(t, http.StatusOK, "GET", c.urls[0]+"/api/v1/products/idle-hot", slow, nil)
		for i := range buyers {
			buy(int64(i + 1))
		}
		r, err := c.client.Do(t.Context(), "POST", c.urls[0]+path, "", map[string]int{"quantity": 1})
		if err != nil || r.Status != http.StatusUnauthorized {
			t.Fatalf("round %d: unauthenticated purchase beside %d idle bodies: %d %s %v, want 401", round, idle, r.Status, r.Body, err)
		}
		for _, p := range conns {
			if code := p.finish(t); code != http.StatusCreated {
				t.Fatalf("round %d: the idle purchase, finished: %d, want 201", round, code)
			}
		}
	}
	if after := admissionLimit(t, c, "/api/v1/seckill/:sku/purchase"); after < before {
		t.Errorf("the purchase route's limit fell from %d to %d over %d rounds of %d idle bodies", before, after, rounds, idle)
	}
}

// idlePurchase is a purchase whose headers and first body byte were sent.
type idlePurchase struct {
	conn net.Conn
	rest string
}

func startIdlePurchase(t *testing.T, base, path, token string) *idlePurchase {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	body := `{"quantity":1}`
	head := "POST " + path + " HTTP/1.1\r\nHost: " + u.Host + "\r\nAuthorization: Bearer " + token +
		"\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n"
	if _, err := io.WriteString(conn, head+body[:1]); err != nil {
		t.Fatal(err)
	}
	return &idlePurchase{conn: conn, rest: body[1:]}
}

// finish sends the rest of the body and returns the answer's status.
func (p *idlePurchase) finish(t *testing.T) int {
	t.Helper()
	if _, err := io.WriteString(p.conn, p.rest); err != nil {
		t.Fatal(err)
	}
	res, err := http.ReadResponse(bufio.NewReader(p.conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	_ = res.Body.Close()
	_ = p.conn.Close()
	return res.StatusCode
}

// admissionLimit reads shop_admission_limit of route.
func admissionLimit(t *testing.T, c *cluster, route string) int {
	t.Helper()
	r := c.client.Must(t, http.StatusOK, "GET", c.urls[0]+"/metrics", "", nil)
	prefix := `shop_admission_limit{route="` + route + `"} `
	for line := range strings.Lines(string(r.Body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			n, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", line, err)
			}
			return int(n)
		}
	}
	t.Fatalf("/metrics has no %s", prefix)
	return 0
}
