package main

import (
	"bufio"
	"bytes"
	"net/http"
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
