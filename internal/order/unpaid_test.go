package order

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestAnUnpaidOrderNeedsAnAccountThatCanPayIt: placing an order without
// paying reserves stock for the pay timeout, so it is refused to a user
// with no account (404 account-not-found), beyond what the balance can pay
// for all the user's unpaid orders together (422 insufficient-funds), and
// beyond the units one user may hold unpaid (409 unpaid-limit). Each
// refusal changes nothing.
func TestAnUnpaidOrderNeedsAnAccountThatCanPayIt(t *testing.T) {
	s := newShop(t, Options{MaxUnpaidUnits: 3})
	place := func(as int64, body string) (int, string) {
		w := s.do("POST", "/api/v1/orders", as, s.token(as), body)
		return w.Code, w.Body.String()
	}
	before := s.state()
	for _, tc := range []struct {
		name   string
		as     int64
		body   string
		status int
		detail string
	}{
		{"no-account", 99, `{"sku":"widget","quantity":1}`, http.StatusNotFound, "account-not-found"},
		{"no-account-free", 99, `{"sku":"sticker","quantity":1}`, http.StatusNotFound, "account-not-found"},
		{"more-than-the-balance", user, `{"sku":"gold","quantity":2}`, http.StatusUnprocessableEntity, "insufficient-funds"},
		{"more-units-than-one-may-hold", user, `{"sku":"widget","quantity":4}`, http.StatusConflict, "unpaid-limit"},
	} {
		if code, body := place(tc.as, tc.body); code != tc.status || !strings.Contains(body, tc.detail) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, code, body, tc.status, tc.detail)
		}
	}
	if got := s.state(); got != before {
		t.Fatalf("the refused orders changed the stores: %+v, want %+v", got, before)
	}

	// One gold bar (600.00) fits the balance (1,000.00); a second, unpaid
	// beside it, does not.
	if code, body := place(user, `{"sku":"gold","quantity":1}`); code != http.StatusCreated {
		t.Fatalf("one gold bar: %d %s", code, body)
	}
	if code, body := place(user, `{"sku":"gold","quantity":1}`); code != http.StatusUnprocessableEntity || !strings.Contains(body, "unpaid") {
		t.Errorf("a second gold bar unpaid: %d %s, want 422 saying why", code, body)
	}
	// Paid at once, an order is not held unpaid: it needs only the money.
	if code, body := place(user+1, `{"sku":"widget","quantity":5,"pay":true}`); code != http.StatusCreated {
		t.Errorf("five widgets paid at once: %d %s", code, body)
	}
	s.auditOK()
}

// TestUnpaidUnitsPerUserAreCappedExactly: ten one-unit orders of one user
// at once, with at most three units unpaid per user: exactly three are
// placed, however they interleave; after one is paid, one more may be.
func TestUnpaidUnitsPerUserAreCappedExactly(t *testing.T) {
	s := newShop(t, Options{MaxUnpaidUnits: 3})
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = s.token(user)
	}
	codes := map[int]int{}
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = make(chan struct{})
		first string
	)
	for _, key := range keys {
		wg.Go(func() {
			<-start
			w := s.do("POST", "/api/v1/orders", user, key, `{"sku":"widget","quantity":1}`)
			mu.Lock()
			defer mu.Unlock()
			codes[w.Code]++
			if w.Code == http.StatusCreated && first == "" {
				first = w.Header().Get("Location")
			}
		})
	}
	close(start)
	wg.Wait()
	if codes[http.StatusCreated] != 3 || codes[http.StatusConflict] != 7 {
		t.Fatalf("answers %v, want 3 × 201 and 7 × 409", codes)
	}
	if w := s.do("POST", first+"/pay", user, "", ""); w.Code != http.StatusOK {
		t.Fatalf("pay: %d %s", w.Code, w.Body)
	}
	if w := s.do("POST", "/api/v1/orders", user, s.token(user), `{"sku":"widget","quantity":1}`); w.Code != http.StatusCreated {
		t.Errorf("after one was paid: %d %s, want 201", w.Code, w.Body)
	}
	s.auditOK()
}

// TestReservedUnpaidUnitsAreExported: shop_order_reserved_unpaid_units
// counts, per SKU, the units held by orders awaiting payment.
func TestReservedUnpaidUnitsAreExported(t *testing.T) {
	s := newShop(t, Options{})
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.orders.ReservedUnpaidCollector())
	for _, body := range []string{`{"sku":"widget","quantity":2}`, `{"sku":"widget","quantity":1}`,
		`{"sku":"sticker","quantity":4}`, `{"sku":"widget","quantity":5,"pay":true}`} {
		if w := s.do("POST", "/api/v1/orders", user, s.token(user), body); w.Code != http.StatusCreated {
			t.Fatalf("%s: %d %s", body, w.Code, w.Body)
		}
	}
	want := fmt.Sprintf(`
# HELP shop_order_reserved_unpaid_units %s
# TYPE shop_order_reserved_unpaid_units gauge
shop_order_reserved_unpaid_units{sku="sticker"} 4
shop_order_reserved_unpaid_units{sku="widget"} 3
`, reservedUnpaidHelp)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}
