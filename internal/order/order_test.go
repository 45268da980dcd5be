package order

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/idem"
	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/storage"
	"github.com/lockbench/shop/internal/testenv"
)

func TestMain(m *testing.M) {
	slog.SetDefault(slog.New(slog.DiscardHandler)) // the 503s below are meant
	goleak.VerifyTestMain(m)
}

const testSecret = "order-test-secret-of-at-least-32-bytes"

func random() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func env(t *testing.T, name string) string { return testenv.Require(t, name) }

// openDB opens a fresh database: on MariaDB when SHOP_TEST_MYSQL_DSN is set
// (a database of its own, dropped at the end), else on SQLite.
func openDB(t *testing.T) *storage.DB {
	t.Helper()
	ctx := context.Background()
	o := storage.Options{MaxConns: 20}
	if dsn := os.Getenv("SHOP_TEST_MYSQL_DSN"); dsn != "" {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		root, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		name := "shop_test_order_" + random()
		if _, err := root.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
			root.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = root.ExecContext(ctx, "DROP DATABASE "+name)
			root.Close()
		})
		cfg.DBName, cfg.ParseTime = name, true
		cfg.ClientFoundRows = true // as config.Load sets it: fenced writes count matched rows
		o.MySQLDSN = cfg.FormatDSN()
	}
	db, err := storage.Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	models := slices.Concat(account.Models(), inventory.Models(), Models(), idem.Models())
	if err := db.Migrate(ctx, models...); err != nil {
		t.Fatal(err)
	}
	return db
}

// shop is the three domains on real stores, behind the real router pieces.
type shop struct {
	t        *testing.T
	db       *storage.DB
	router   *gin.Engine
	auth     *auth.Auth
	accounts *account.Store
	products *inventory.Store
	orders   *Store
	service  *Service
	domain   *Domain
	auditor  *audit.Auditor
	locker   lockkit.Locker
}

const (
	user    = 7
	price   = 1_250
	opening = 100_000
	stock   = 20
)

// redisLocker is a Redis lock on the shared test server, under a prefix of
// its own that the test deletes at its end.
func redisLocker(t *testing.T) (lockkit.Locker, redis.UniversalClient, string) {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: env(t, "SHOP_TEST_REDIS_ADDR"), ContextTimeoutEnabled: true})
	prefix := "order_test:" + random() + ":"
	locker, err := redislock.New(client, redislock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, pattern := range []string{prefix + "*", "{" + prefix + "*"} {
			it := client.Scan(ctx, 0, pattern, 500).Iterator()
			for it.Next(ctx) {
				client.Del(ctx, it.Val())
			}
		}
		locker.Close()
		client.Close()
	})
	return locker, client, prefix
}

// newShop wires the domains with a Redis lock and o (its Locker, if set,
// replaces the Redis lock for the order service).
func newShop(t *testing.T, o Options) *shop {
	ctx := context.Background()
	locker, client, prefix := redisLocker(t)
	db := openDB(t)
	s := &shop{t: t, db: db, auth: auth.New([]byte(testSecret), "admin"),
		accounts: account.NewStore(db.DB), products: inventory.NewStore(db.DB, nil)}
	s.orders = NewStore(db.DB, s.products, s.accounts)
	if o.Locker == nil {
		o.Locker = locker
	}
	if o.LockOptions == nil {
		o.LockOptions = []lockkit.Option{lockkit.WithWaitTimeout(10 * time.Second)}
	}
	s.locker = o.Locker
	s.service = NewService(s.orders, o)
	tokens, err := idem.New(client, idem.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	s.domain = &Domain{Service: s.service, Store: s.orders, Idem: tokens}
	s.auditor = audit.New(append(append(
		(&account.Domain{Store: s.accounts}).Checks(),
		(&inventory.Domain{Store: s.products}).Checks()...),
		s.domain.Checks()...), nil)

	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.Use(problem.Errors(slices.Concat(Problems(), account.Problems(), inventory.Problems())),
		problem.Recover(), problem.LimitBody(1<<16))
	s.domain.Register(r.Group("/api/v1", s.auth.User()), r.Group("/admin/v1", s.auth.Admin()))
	s.router = r

	for _, id := range []int64{user, user + 1} {
		if _, err := s.accounts.Put(ctx, id, opening); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []inventory.Product{
		{SKU: "widget", Name: "Widget", Stock: stock, PriceCents: price},
		{SKU: "sticker", Name: "Free sticker", Stock: stock, PriceCents: 0},
		{SKU: "gold", Name: "Gold bar", Stock: 5, PriceCents: 60_000},
	} {
		if _, err := s.products.Put(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func (s *shop) do(method, path string, as int64, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	tok, err := s.auth.Token(as, time.Hour, time.Now())
	if err != nil {
		s.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if key != "" {
		req.Header.Set(idem.KeyHeader, key)
	}
	w := httptest.NewRecorder()
	s.router.ServeHTTP(w, req)
	return w
}

func (s *shop) token(as int64) string {
	w := s.do("POST", "/api/v1/idempotency-tokens", as, "", "")
	var tok idem.Token
	if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &tok) != nil {
		s.t.Fatalf("issue token: %d %s", w.Code, w.Body)
	}
	return tok.Key
}

// state is what the stores hold, counted from the rows themselves.
type state struct {
	orders, debits, reservations, returns int64
	balance, stock                        int64
	events                                int64 // outbox rows
}

func (s *shop) state() state {
	ctx := context.Background()
	var st state
	db := s.db.WithContext(ctx)
	must := func(err error) {
		if err != nil {
			s.t.Fatal(err)
		}
	}
	must(db.Model(&Order{}).Count(&st.orders).Error)
	must(db.Model(&account.LedgerEntry{}).Where("account_id = ? AND kind = ?", user, account.KindOrder).Count(&st.debits).Error)
	must(db.Model(&inventory.Purchase{}).Where("quantity > 0").Count(&st.reservations).Error)
	must(db.Model(&inventory.Purchase{}).Where("quantity < 0").Count(&st.returns).Error)
	must(db.Model(&events.OutboxRow{}).Count(&st.events).Error)
	a, err := s.accounts.Get(ctx, user)
	must(err)
	p, err := s.products.Get(ctx, "widget")
	must(err)
	st.balance, st.stock = a.Balance, p.Stock
	return st
}

func (s *shop) audit() audit.Report {
	s.t.Helper()
	r, err := s.auditor.Audit(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	return r
}

func (s *shop) auditOK() {
	s.t.Helper()
	r := s.audit()
	if !r.OK {
		b, _ := json.Marshal(r)
		s.t.Fatalf("audit: %s", b)
	}
	for _, name := range []string{"duplicate_orders", "unreconciled_order_cents", "unreconciled_order_units",
		"miscounted_order_records", "paid_and_cancelled_orders", "stock_returned_twice", "stuck_orders",
		"misattributed_order_records", "unpublished_order_events"} {
		if _, ok := r.Drifts[name]; !ok {
			s.t.Fatalf("the audit has no %s check", name)
		}
	}
}

func decode[T any](t *testing.T, w *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(w.Body.Bytes(), &v); err != nil {
		t.Fatalf("%d %s: %v", w.Code, w.Body, err)
	}
	return v
}

func jsonID(o Order) string { b, _ := json.Marshal(o.ID); return string(b) }

// Fifty identical requests with one key, released together: one order, one
// debit, one reservation; every other answer is 409 or the first answer
// again.
func TestFiftyDuplicatesPlaceOneOrder(t *testing.T) {
	s := newShop(t, Options{})
	key := s.token(user)
	const body = `{"sku":"widget","quantity":2,"pay":true}`
	start := make(chan struct{})
	var wg sync.WaitGroup
	res := make([]*httptest.ResponseRecorder, 50)
	for i := range res {
		wg.Go(func() {
			<-start
			res[i] = s.do("POST", "/api/v1/orders", user, key, body)
		})
	}
	close(start)
	wg.Wait()

	first := oneCreatedTheRestReplayed(t, res)
	want := state{orders: 1, debits: 1, reservations: 1, balance: opening - 2*price, stock: stock - 2, events: 2}
	if got := s.state(); got != want {
		t.Fatalf("stores hold %+v; want %+v", got, want)
	}
	o := decode[Order](t, first)
	if o.Status != StatusPaid || o.AmountCents != 2*price || o.UserID != user || o.PaidAt == nil {
		t.Fatalf("order %+v", o)
	}
	if loc := first.Header().Get("Location"); loc != "/api/v1/orders/"+jsonID(o) {
		t.Fatalf("Location %q", loc)
	}
	other := s.do("POST", "/api/v1/orders", user, key, `{"sku":"widget","quantity":3}`)
	if other.Code != http.StatusUnprocessableEntity || !strings.Contains(other.Body.String(), "idempotency-key-reused") {
		t.Fatalf("same key, other body: %d %s", other.Code, other.Body)
	}
	if got := s.state(); got != want {
		t.Fatalf("after the retries the stores hold %+v; want %+v", got, want)
	}
	s.auditOK()
}

// oneCreatedTheRestReplayed wants every answer of res to be 409 or 201,
// and the 201s to be one original and its replays, and returns the first.
func oneCreatedTheRestReplayed(t *testing.T, res []*httptest.ResponseRecorder) *httptest.ResponseRecorder {
	t.Helper()
	var created []*httptest.ResponseRecorder
	conflicts := 0
	for _, w := range res {
		switch w.Code {
		case http.StatusCreated:
			created = append(created, w)
		case http.StatusConflict:
			conflicts++
		default:
			t.Fatalf("unexpected answer %d %s", w.Code, w.Body)
		}
	}
	if len(created) == 0 {
		t.Fatalf("no request placed the order (%d conflicts)", conflicts)
	}
	first := created[0]
	originals := 0
	for _, w := range created {
		if w.Body.String() != first.Body.String() {
			t.Fatalf("two different 201 bodies:\n%s\n%s", first.Body, w.Body)
		}
		if w.Header().Get(idem.ReplayedHeader) != "true" {
			originals++
		}
	}
	if originals != 1 {
		t.Fatalf("%d responses were not replays; want exactly 1", originals)
	}
	return first
}

func TestRefusalsChangeNothingAndAreReplayed(t *testing.T) {
	s := newShop(t, Options{})
	before := s.state()
	for _, tc := range []struct {
		name, body string
		status     int
		slug       string
	}{
		{"insufficient-funds-422", `{"sku":"gold","quantity":2,"pay":true}`, 422, "insufficient-funds"},
		{"sold-out-409", `{"sku":"widget","quantity":21}`, 409, "sold-out"},
		{"sold-out-paying-409", `{"sku":"widget","quantity":21,"pay":true}`, 409, "sold-out"},
		{"unknown-sku-404", `{"sku":"nothing","quantity":1}`, 404, "product-not-found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := s.token(user)
			first := s.do("POST", "/api/v1/orders", user, key, tc.body)
			if first.Code != tc.status || !strings.Contains(first.Body.String(), tc.slug) {
				t.Fatalf("%d %s; want %d %s", first.Code, first.Body, tc.status, tc.slug)
			}
			again := s.do("POST", "/api/v1/orders", user, key, tc.body)
			if again.Code != first.Code || again.Body.String() != first.Body.String() || again.Header().Get(idem.ReplayedHeader) != "true" {
				t.Fatalf("retry: %d %s", again.Code, again.Body)
			}
			if got := s.state(); got != before {
				t.Fatalf("a refused order changed the stores: %+v, before %+v", got, before)
			}
			s.auditOK()
		})
	}
	for _, tc := range []struct{ name, key, body, slug string }{
		{"no-key-400", "", `{"sku":"widget","quantity":1}`, "idempotency-key-missing"},
		{"bad-key-422", "AAAAAAAAAAAAAAAAAAAAAA", `{"sku":"widget","quantity":1}`, "idempotency-key-unknown"},
		{"foreign-key-422", s.token(user + 1), `{"sku":"widget","quantity":1}`, "idempotency-key-unknown"},
		{"missing-field-400", s.token(user), `{"sku":"widget"}`, "invalid-input"},
		{"zero-quantity-400", s.token(user), `{"sku":"widget","quantity":0}`, "invalid-input"},
		{"pay-not-bool-400", s.token(user), `{"sku":"widget","quantity":1,"pay":"yes"}`, "invalid-input"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := s.do("POST", "/api/v1/orders", user, tc.key, tc.body)
			if w.Code >= 500 || w.Code < 400 || !strings.Contains(w.Body.String(), tc.slug) {
				t.Fatalf("%d %s; want %s", w.Code, w.Body, tc.slug)
			}
		})
	}
	if got := s.state(); got != before {
		t.Fatalf("bad requests changed the stores: %+v, before %+v", got, before)
	}
}

// The lifecycle through HTTP: placed awaiting payment with its stock
// reserved, paid once, read alone and in pages.
func TestLifecycle(t *testing.T) {
	// The big order below is left unpaid whole.
	s := newShop(t, Options{MaxUnpaidUnits: stock})
	o := s.place(`{"sku":"widget","quantity":3}`)
	if o.Status != StatusAwaitingPayment || o.PaidAt != nil || o.AmountCents != 3*price {
		t.Fatalf("placed %+v", o)
	}
	if got := s.state(); got.stock != stock-3 || got.balance != opening || got.debits != 0 {
		t.Fatalf("after placing: %+v; want the stock reserved and no debit", got)
	}
	s.auditOK()

	pay := "/api/v1/orders/" + jsonID(o) + "/pay"
	s.payTwiceDebitsOnce(o, pay)
	s.badPaysAreRefused(pay)

	// A free product is ordered and paid without a debit.
	free := s.place(`{"sku":"sticker","quantity":2,"pay":true}`)
	if free.Status != StatusPaid || free.AmountCents != 0 {
		t.Fatalf("free order %+v", free)
	}
	// Paying more than the balance is refused and changes nothing.
	big := s.place(`{"sku":"widget","quantity":16}`)
	if err := s.db.Exec("UPDATE accounts SET balance = 100, opening = opening - ? WHERE id = ?", opening-3*price-100, user).Error; err != nil {
		t.Fatal(err)
	}
	if w := s.do("POST", "/api/v1/orders/"+jsonID(big)+"/pay", user, "", ""); w.Code != 422 || !strings.Contains(w.Body.String(), "insufficient-funds") {
		t.Fatalf("pay without funds: %d %s", w.Code, w.Body)
	}
	s.auditOK()

	s.pagesList([]int64{big.ID, free.ID, o.ID})
}

// place places an order of user's with a fresh token, and wants 201.
func (s *shop) place(body string) Order {
	s.t.Helper()
	w := s.do("POST", "/api/v1/orders", user, s.token(user), body)
	if w.Code != http.StatusCreated {
		s.t.Fatalf("place %s: %d %s", body, w.Code, w.Body)
	}
	return decode[Order](s.t, w)
}

// payTwiceDebitsOnce pays o (of 3 widgets) through pay twice: both answer
// the paid order, which GET answers too, and one debit is taken.
func (s *shop) payTwiceDebitsOnce(o Order, pay string) {
	t := s.t
	t.Helper()
	first := s.do("POST", pay, user, "", "")
	if first.Code != http.StatusOK {
		t.Fatalf("pay: %d %s", first.Code, first.Body)
	}
	paid := decode[Order](t, first)
	if paid.Status != StatusPaid || paid.PaidAt == nil || paid.ID != o.ID {
		t.Fatalf("paid %+v", paid)
	}
	again := s.do("POST", pay, user, "", "")
	if again.Code != http.StatusOK || again.Body.String() != first.Body.String() {
		t.Fatalf("pay again: %d %s; want 200 %s", again.Code, again.Body, first.Body)
	}
	if get := s.do("GET", "/api/v1/orders/"+jsonID(o), user, "", ""); get.Body.String() != first.Body.String() {
		t.Fatalf("GET %s; want the body pay answered %s", get.Body, first.Body)
	}
	if got := s.state(); got.debits != 1 || got.balance != opening-3*price || got.stock != stock-3 {
		t.Fatalf("after paying twice: %+v; want one debit", got)
	}
}

// badPaysAreRefused pays user's order at pay as another user, and orders
// that do not exist or cannot be named.
func (s *shop) badPaysAreRefused(pay string) {
	s.t.Helper()
	for _, tc := range []struct {
		name   string
		as     int64
		path   string
		status int
		slug   string
	}{
		{"pay-other-user-404", user + 1, pay, 404, "order-not-found"},
		{"pay-missing-404", user, "/api/v1/orders/999999/pay", 404, "order-not-found"},
		{"pay-bad-id-400", user, "/api/v1/orders/x/pay", 400, "invalid-input"},
	} {
		if w := s.do("POST", tc.path, tc.as, "", ""); w.Code != tc.status || !strings.Contains(w.Body.String(), tc.slug) {
			s.t.Errorf("%s: %d %s", tc.name, w.Code, w.Body)
		}
	}
}

// pagesList reads user's orders two to a page, newest first, the cursor
// continuing where the page ended, and wants the ids want; another user
// lists none, and a bad cursor or limit is 400.
func (s *shop) pagesList(want []int64) {
	t := s.t
	t.Helper()
	var ids []int64
	path := "/api/v1/orders?limit=2"
	for range 5 {
		w := s.do("GET", path, user, "", "")
		if w.Code != http.StatusOK {
			t.Fatalf("list: %d %s", w.Code, w.Body)
		}
		p := decode[page](t, w)
		for _, o := range p.Orders {
			ids = append(ids, o.ID)
		}
		if p.NextCursor == "" {
			break
		}
		path = "/api/v1/orders?limit=2&cursor=" + p.NextCursor
	}
	if !slices.Equal(ids, want) {
		t.Fatalf("pages list %v; want %v", ids, want)
	}
	if w := s.do("GET", "/api/v1/orders", user+1, "", ""); w.Code != 200 || w.Body.String() != `{"orders":[]}` {
		t.Fatalf("another user's list: %d %s", w.Code, w.Body)
	}
	for _, q := range []string{"cursor=x", "cursor=", "cursor=" + encodeCursor(0), "limit=0", "limit=101", "limit=a"} {
		if w := s.do("GET", "/api/v1/orders?"+q, user, "", ""); w.Code != 400 || !strings.Contains(w.Body.String(), "invalid-input") {
			t.Errorf("list?%s: %d %s; want 400", q, w.Code, w.Body)
		}
	}
}

// The closer cancels an unpaid order once its timeout passed, returns its
// stock, and a late pay is refused with 409. The order is aged in the
// database rather than by sleeping, so a slow machine cannot pass the
// timeout before the first round.
func TestCloserCancelsUnpaidOrders(t *testing.T) {
	const payTimeout = time.Hour
	s := newShop(t, Options{PayTimeout: payTimeout})
	ctx := context.Background()
	unpaid, _, err := s.service.Place(ctx, user, "k-unpaid", "widget", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	paid, _, err := s.service.Place(ctx, user, "k-paid", "widget", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.service.Pay(ctx, user, paid.ID); err != nil {
		t.Fatal(err)
	}
	if n, err := s.service.CloseExpired(ctx, slog.Default()); n != 0 || err != nil {
		t.Fatalf("closed %d, %v before the timeout", n, err)
	}
	aged := unpaid.CreatedAt.Add(-payTimeout - time.Second)
	if err := s.db.Exec("UPDATE orders SET created_at = ? WHERE id = ?", aged, unpaid.ID).Error; err != nil {
		t.Fatal(err)
	}
	if n, err := s.service.CloseExpired(ctx, slog.Default()); n != 1 || err != nil {
		t.Fatalf("closed %d, %v; want 1", n, err)
	}
	s.cancelledRefusesPay(unpaid)
	if st := s.state(); st.stock != stock-1 || st.balance != opening-price || st.returns != 1 {
		t.Fatalf("after closing: %+v", st)
	}
	s.auditOK()
}

// cancelledRefusesPay wants order o cancelled, and a pay of it refused
// with ErrCancelled, 409 order-cancelled over HTTP.
func (s *shop) cancelledRefusesPay(o Order) {
	t := s.t
	t.Helper()
	ctx := context.Background()
	got, err := s.service.Get(ctx, user, o.ID)
	if err != nil || got.Status != StatusCancelled || got.CancelledAt == nil {
		t.Fatalf("unpaid order %+v, %v", got, err)
	}
	if _, err := s.service.Pay(ctx, user, o.ID); !errors.Is(err, ErrCancelled) {
		t.Fatalf("pay a cancelled order: %v", err)
	}
	w := s.do("POST", "/api/v1/orders/"+jsonID(o)+"/pay", user, "", "")
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "order-cancelled") {
		t.Fatalf("pay a cancelled order: %d %s", w.Code, w.Body)
	}
}

// instances are n order services on one database and one locker, as n shop
// processes would be, each with a critical section long enough for their
// rounds to overlap.
func (s *shop) instances(n int, locker lockkit.Locker, timeout time.Duration) []*Service {
	out := make([]*Service, n)
	for i := range out {
		out[i] = NewService(s.orders, Options{PayTimeout: timeout, Locking: guard.Locking{
			Locker:               locker,
			LockOptions:          []lockkit.Option{lockkit.WithWaitTimeout(10 * time.Second)},
			CriticalSectionDelay: 100 * time.Millisecond,
		}})
	}
	return out
}

// raceTimeout and raceWork time raceCloseAndPay: pays start well before
// the deadline, and are still in their critical section when closers start
// just after it, so that nothing but the locks and the fences keeps them
// apart. The margins are wide (a second and more) so that a loaded machine
// keeps the same order of events.
const (
	raceTimeout = 2 * time.Second
	raceWork    = 2 * time.Second
)

// raceInstances are instances timed for raceCloseAndPay.
func (s *shop) raceInstances(n int, locker lockkit.Locker) []*Service {
	out := s.instances(n, locker, raceTimeout)
	for i := range out {
		out[i].o.CriticalSectionDelay = raceWork
	}
	return out
}

// raceCloseAndPay places orders, pays each a quarter of the pay timeout
// after it was placed, and runs a closer round on every instance just
// after the deadline, while the pays are still deciding and writing.
func (s *shop) raceCloseAndPay(services []*Service, orders int) {
	ctx := context.Background()
	ids := make([]int64, orders)
	var first, last time.Time
	for i := range ids {
		// Placed without the race's critical section: in quick succession.
		o, _, err := s.service.Place(ctx, user, "k"+random(), "widget", 1, false)
		if err != nil {
			s.t.Fatal(err)
		}
		ids[i] = o.ID
		if i == 0 {
			first = o.CreatedAt
		}
		last = o.CreatedAt
	}
	timeout := services[0].o.PayTimeout
	var wg sync.WaitGroup
	time.Sleep(time.Until(first.Add(timeout / 4)))
	for _, id := range ids {
		wg.Go(func() { _, _ = services[0].Pay(ctx, user, id) })
	}
	time.Sleep(time.Until(last.Add(timeout + 50*time.Millisecond)))
	for _, svc := range services {
		wg.Go(func() { _, _ = svc.CloseExpired(ctx, slog.Default()) })
	}
	wg.Wait()
}

// With a lock, closers on three instances and pays racing them leave every
// order either paid or cancelled, each effect once.
func TestCloseAndPayRaceWithLock(t *testing.T) {
	s := newShop(t, Options{})
	s.raceCloseAndPay(s.raceInstances(3, s.locker), 4)
	s.auditOK()
}

// With no lock (the none baseline), the same race shows the damage the
// audit names: orders both paid and cancelled, stock returned twice.
func TestCloseAndPayRaceWithoutLockIsCaught(t *testing.T) {
	s := newShop(t, Options{Locking: guard.Locking{Locker: lockkit.None()}})
	s.raceCloseAndPay(s.raceInstances(3, lockkit.None()), 4)
	r := s.audit()
	b, _ := json.Marshal(r)
	t.Logf("audit: %s", b)
	if r.OK || r.Drifts["stock_returned_twice"].Total == 0 || r.Drifts["paid_and_cancelled_orders"].Total == 0 ||
		r.Drifts["unreconciled_order_units"].Total == 0 {
		t.Fatalf("the none baseline shows no returned-twice or paid-and-cancelled damage: %s", b)
	}
}

// syncBuffer is a log sink safe for the closers' goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) count(msg string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Count(s.b.String(), `msg="`+msg+`"`)
}

// Two instances run the closer loop; each round runs on whichever takes
// the leader lease. When one stops, the other goes on closing. Both loops
// end with their context (goleak checks at the end of the package).
func TestCloserRoundsGoOnWhenAnInstanceStops(t *testing.T) {
	s := newShop(t, Options{})
	services := s.instances(2, s.locker, 300*time.Millisecond)
	logs := []*syncBuffer{{}, {}}
	stop := make([]context.CancelFunc, len(services))
	var wg sync.WaitGroup
	for i, svc := range services {
		ctx, cancel := context.WithCancel(context.Background())
		stop[i] = cancel
		wg.Go(func() { svc.RunCloser(ctx, slog.New(slog.NewTextHandler(logs[i], nil))) })
	}
	defer func() {
		for _, cancel := range stop {
			cancel()
		}
		wg.Wait()
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !cond() {
			if time.Now().After(deadline) {
				t.Fatalf("%s did not happen in 20s", what)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	cancelled := func(id int64) func() bool {
		return func() bool {
			got, err := s.service.Get(context.Background(), user, id)
			return err == nil && got.Status == StatusCancelled
		}
	}
	o, _, err := services[0].Place(context.Background(), user, "k1", "widget", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the first order closed", cancelled(o.ID))
	stop[0]()
	o2, _, err := services[1].Place(context.Background(), user, "k2", "widget", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the second order closed", cancelled(o2.ID))
	if logs[1].count("order closer: leading") == 0 {
		t.Fatal("the instance left running never led a round")
	}
	s.auditOK()
}

// A holder whose lease ran out while it worked (a newer token claimed a
// row it is about to write) is refused whole: neither the order's status
// nor the debit or the stock's return lands.
func TestStaleHolderIsRefusedWhole(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		fences Fences
		steal  func(s *shop, o Order) error // a newer holder claims one row
		change func(o *Order) error
	}{
		{"pay-order-row-stolen", Fences{Order: 10, Account: 10},
			func(s *shop, o Order) error { return s.orders.claim(ctx, o.ID, 11) },
			func(o *Order) error { return o.pay(now()) }},
		{"pay-account-row-stolen", Fences{Order: 10, Account: 10},
			func(s *shop, o Order) error { return s.accounts.Claim(ctx, user, 11) },
			func(o *Order) error { return o.pay(now()) }},
		{"close-stock-row-stolen", Fences{Order: 10, Stock: 10},
			func(s *shop, o Order) error { return s.products.Claim(ctx, "widget", 11) },
			func(o *Order) error { o.cancel(now(), 0); return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newShop(t, Options{})
			o, _, err := s.service.Place(ctx, user, "k", "widget", 2, false)
			if err != nil {
				t.Fatal(err)
			}
			before := s.state()
			s.orders.beforeWrite = func(context.Context) {
				if err := tc.steal(s, o); err != nil {
					t.Error(err)
				}
			}
			_, err = s.orders.Update(ctx, o.ID, tc.fences, func(_ context.Context, o *Order) error { return tc.change(o) })
			if !errors.Is(err, lockkit.ErrFenced) {
				t.Fatalf("stale write: %v; want ErrFenced", err)
			}
			if got := s.state(); got != before {
				t.Fatalf("a stale write changed the stores: %+v, before %+v", got, before)
			}
			if got, _ := s.service.Get(ctx, user, o.ID); got.Status != StatusAwaitingPayment {
				t.Fatalf("order %+v", got)
			}
			s.auditOK()
		})
	}
}

// The same for placing: the order row is not inserted when the stock's
// write is refused.
func TestStalePlaceIsRefusedWhole(t *testing.T) {
	ctx := context.Background()
	s := newShop(t, Options{})
	before := s.state()
	s.orders.beforeWrite = func(context.Context) {
		if err := s.products.Claim(ctx, "widget", 11); err != nil {
			t.Error(err)
		}
	}
	o := Order{UserID: user, IdempotencyKey: "k", SKU: "widget", Quantity: 1}
	_, err := s.orders.Create(ctx, &o, Fences{Stock: 10, Account: 10}, func(_ context.Context, o *Order, p inventory.Product) error {
		o.AmountCents, o.Status, o.CreatedAt = p.PriceCents, StatusPaid, now()
		o.PaidAt = &o.CreatedAt
		return nil
	})
	if !errors.Is(err, lockkit.ErrFenced) {
		t.Fatalf("stale place: %v; want ErrFenced", err)
	}
	if got := s.state(); got != before {
		t.Fatalf("a stale place changed the stores: %+v, before %+v", got, before)
	}
	s.auditOK()
}

// Pay takes the client's optional Idempotency-Key: the retry with it is a
// replay; without one, paying again answers the same order. One debit.
func TestPayWithClientKey(t *testing.T) {
	s := newShop(t, Options{})
	o, _, err := s.service.Place(context.Background(), user, "k", "widget", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	path := "/api/v1/orders/" + jsonID(o) + "/pay"
	first := s.do("POST", path, user, "3f2a1c9e-6b1d-4a3c-9f0e-1d2c3b4a5f6e", "")
	again := s.do("POST", path, user, "3f2a1c9e-6b1d-4a3c-9f0e-1d2c3b4a5f6e", "")
	bare := s.do("POST", path, user, "", "")
	if first.Code != 200 || again.Code != 200 || bare.Code != 200 {
		t.Fatalf("pays: %d %s, %d %s, %d %s", first.Code, first.Body, again.Code, again.Body, bare.Code, bare.Body)
	}
	if again.Header().Get(idem.ReplayedHeader) != "true" || again.Body.String() != first.Body.String() ||
		bare.Body.String() != first.Body.String() {
		t.Fatalf("the retries differ: %s / %s %v / %s", first.Body, again.Body, again.Header(), bare.Body)
	}
	if got := s.state(); got.debits != 1 || got.balance != opening-price {
		t.Fatalf("after three pays: %+v; want one debit", got)
	}
	s.auditOK()
}

// Every write of a balance or a stock bumps its row's version, the
// optimistic strategies' check: an order's debit, reservation and return
// are writes like any other.
func TestOrderWritesBumpVersions(t *testing.T) {
	s := newShop(t, Options{PayTimeout: 50 * time.Millisecond})
	ctx := context.Background()
	versions := func() (acct, prod uint64) {
		a, err := s.accounts.Get(ctx, user)
		if err != nil {
			t.Fatal(err)
		}
		p, err := s.products.Get(ctx, "widget")
		if err != nil {
			t.Fatal(err)
		}
		return a.Version, p.Version
	}
	a0, p0 := versions()
	if _, _, err := s.service.Place(ctx, user, "k1", "widget", 1, true); err != nil {
		t.Fatal(err)
	}
	if a, p := versions(); a != a0+1 || p != p0+1 {
		t.Fatalf("after place and pay: versions %d, %d; want %d, %d", a, p, a0+1, p0+1)
	}
	if _, _, err := s.service.Place(ctx, user, "k2", "widget", 1, false); err != nil {
		t.Fatal(err)
	}
	time.Sleep(60 * time.Millisecond)
	if n, err := s.service.CloseExpired(ctx, slog.Default()); n != 1 || err != nil {
		t.Fatalf("closed %d, %v", n, err)
	}
	if a, p := versions(); a != a0+1 || p != p0+3 {
		t.Fatalf("after a reservation and its return: versions %d, %d; want %d, %d", a, p, a0+1, p0+3)
	}
}

// The closer holds its leader lease for a round, not between rounds: on
// some backends a held lease is a held resource (on mysql-forupdate an
// open transaction, which stops InnoDB's purge for the whole server while
// it lasts). Between two rounds another instance can take the lease.
func TestCloserHoldsTheLeaderLeaseOnlyForARound(t *testing.T) {
	s := newShop(t, Options{})
	svc := s.instances(1, s.locker, 300*time.Millisecond)[0]
	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { svc.RunCloser(ctx, slog.New(slog.NewTextHandler(&logs, nil))) })
	defer func() { cancel(); wg.Wait() }()
	o, _, err := svc.Place(context.Background(), user, "k1", "widget", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for got, err := s.service.Get(context.Background(), user, o.ID); err != nil || got.Status != StatusCancelled; got, err = s.service.Get(context.Background(), user, o.ID) {
		if time.Now().After(deadline) {
			t.Fatal("the closer did not close the expired order in 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for {
		lease, err := s.locker.TryAcquire(context.Background(), LeaderKey.String())
		if err == nil {
			_ = lease.Release(context.Background())
			return
		}
		if !errors.Is(err, lockkit.ErrNotAcquired) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the leader lease stayed held between the closer's rounds")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
