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
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/auth"
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
	models := append(append(account.Models(), inventory.Models()...), Models()...)
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
	auditor  *audit.Auditor
}

const (
	user    = 7
	price   = 1_250
	opening = 100_000
	stock   = 20
)

// newShop wires the domains with a Redis lock; stock may wrap the real
// inventory service to inject failures.
func newShop(t *testing.T, wrapStock func(Stock) Stock) *shop {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: env(t, "SHOP_TEST_REDIS_ADDR")})
	prefix := "order_test:" + random() + ":"
	locker := redislock.New(client, redislock.WithPrefix(prefix))
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
	db := openDB(t)
	s := &shop{t: t, db: db, auth: auth.New([]byte(testSecret), "admin"),
		accounts: account.NewStore(db.DB), products: inventory.NewStore(db.DB, nil), orders: NewStore(db.DB)}
	lockOpts := []lockkit.Option{lockkit.WithWaitTimeout(10 * time.Second)}
	// A delay inside the account's critical section keeps the first order
	// running while its duplicates arrive.
	wallet := account.NewService(s.accounts, account.Options{Locker: locker, LockOptions: lockOpts,
		CriticalSectionDelay: 20 * time.Millisecond})
	inv, err := inventory.NewService(s.products, inventory.Options{Locker: locker, LockOptions: lockOpts})
	if err != nil {
		t.Fatal(err)
	}
	var st Stock = inv
	if wrapStock != nil {
		st = wrapStock(inv)
	}
	s.service = NewService(s.orders, st, wallet)
	tokens, err := idem.New(client, idem.Options{Locker: locker, Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	d := &Domain{Service: s.service, Store: s.orders, Idem: tokens}
	s.auditor = audit.New(append(append(
		(&account.Domain{Store: s.accounts}).Checks(),
		(&inventory.Domain{Store: s.products}).Checks()...),
		d.Checks()...), nil)

	gin.SetMode(gin.TestMode)
	r := gin.New()
	r.Use(problem.Recover(), problem.LimitBody(1<<16))
	d.Register(r.Group("/api/v1", s.auth.User()), r.Group("/admin/v1", s.auth.Admin()))
	s.router = r

	if _, err := s.accounts.Put(ctx, user, opening); err != nil {
		t.Fatal(err)
	}
	if _, err := s.accounts.Put(ctx, user+1, opening); err != nil {
		t.Fatal(err)
	}
	if _, err := s.products.Put(ctx, inventory.Product{SKU: "widget", Name: "Widget", Stock: stock, PriceCents: price}); err != nil {
		t.Fatal(err)
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
	orders, withdrawals, deposits, purchases int64
	balance, stock                           int64
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
	must(db.Model(&account.LedgerEntry{}).Where("account_id = ? AND kind = ?", user, "withdraw").Count(&st.withdrawals).Error)
	must(db.Model(&account.LedgerEntry{}).Where("account_id = ? AND kind = ?", user, "deposit").Count(&st.deposits).Error)
	must(db.Model(&inventory.Purchase{}).Count(&st.purchases).Error)
	a, err := s.accounts.Get(ctx, user)
	must(err)
	p, err := s.products.Get(ctx, "widget")
	must(err)
	st.balance, st.stock = a.Balance, p.Stock
	return st
}

func (s *shop) auditOK() {
	s.t.Helper()
	r, err := s.auditor.Audit(context.Background())
	if err != nil {
		s.t.Fatal(err)
	}
	if !r.OK {
		b, _ := json.Marshal(r)
		s.t.Fatalf("audit: %s", b)
	}
	if _, ok := r.Drifts["duplicate_orders"]; !ok {
		s.t.Fatal("the audit has no duplicate_orders check")
	}
}

// Fifty identical requests with one key, released together: one order, one
// charge, one unit of stock taken; every other answer is 409 or the first
// answer again.
func TestFiftyDuplicatesPlaceOneOrder(t *testing.T) {
	s := newShop(t, nil)
	key := s.token(user)
	const body = `{"sku":"widget","quantity":2}`
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
	t.Logf("50 duplicates: 1 placed, %d replays, %d conflicts", len(created)-1, conflicts)

	want := state{orders: 1, withdrawals: 1, purchases: 1, balance: opening - 2*price, stock: stock - 2}
	if got := s.state(); got != want {
		t.Fatalf("stores hold %+v; want %+v", got, want)
	}
	var o Order
	if err := json.Unmarshal(first.Body.Bytes(), &o); err != nil {
		t.Fatal(err)
	}
	if o.Status != StatusPlaced || o.AmountCents != 2*price || o.PurchaseID == 0 || o.UserID != user {
		t.Fatalf("order %+v", o)
	}
	if loc := first.Header().Get("Location"); loc != "/api/v1/orders/"+jsonID(o) {
		t.Fatalf("Location %q", loc)
	}

	again := s.do("POST", "/api/v1/orders", user, key, body)
	if again.Code != http.StatusCreated || again.Body.String() != first.Body.String() ||
		again.Header().Get(idem.ReplayedHeader) != "true" || again.Header().Get("Location") != first.Header().Get("Location") {
		t.Fatalf("retry after completion: %d %s %v", again.Code, again.Body, again.Header())
	}
	other := s.do("POST", "/api/v1/orders", user, key, `{"sku":"widget","quantity":3}`)
	if other.Code != http.StatusUnprocessableEntity || !strings.Contains(other.Body.String(), "idempotency-key-reused") {
		t.Fatalf("same key, other body: %d %s", other.Code, other.Body)
	}
	if got := s.state(); got != want {
		t.Fatalf("after the retries the stores hold %+v; want %+v", got, want)
	}
	s.auditOK()

	// The owner reads the order; anyone else gets the 404 of a missing one.
	if w := s.do("GET", "/api/v1/orders/"+jsonID(o), user, "", ""); w.Code != http.StatusOK {
		t.Fatalf("owner GET: %d %s", w.Code, w.Body)
	}
	if w := s.do("GET", "/api/v1/orders/"+jsonID(o), user+1, "", ""); w.Code != http.StatusNotFound {
		t.Fatalf("other user GET: %d %s", w.Code, w.Body)
	}
	if w := s.do("GET", "/api/v1/orders/999999", user, "", ""); w.Code != http.StatusNotFound {
		t.Fatalf("missing order GET: %d %s", w.Code, w.Body)
	}
	if w := s.do("GET", "/api/v1/orders/x", user, "", ""); w.Code != http.StatusBadRequest {
		t.Fatalf("bad id GET: %d %s", w.Code, w.Body)
	}
}

func jsonID(o Order) string { b, _ := json.Marshal(o.ID); return string(b) }

func TestRefusalsChangeNothingAndAreReplayed(t *testing.T) {
	s := newShop(t, nil)
	before := s.state()
	for _, tc := range []struct {
		name, body string
		status     int
		slug       string
		refunded   bool
	}{
		{"insufficient-funds-422", `{"sku":"widget","quantity":81}`, 422, "insufficient-funds", false},
		{"sold-out-409", `{"sku":"widget","quantity":21}`, 409, "sold-out", true},
		{"unknown-sku-404", `{"sku":"nothing","quantity":1}`, 404, "product-not-found", false},
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
			got := s.state()
			if got.orders != 0 || got.purchases != 0 || got.balance != before.balance || got.stock != before.stock {
				t.Fatalf("a refused order changed the stores: %+v, before %+v", got, before)
			}
			if tc.refunded && got.deposits != got.withdrawals {
				t.Fatalf("charged %d times, refunded %d", got.withdrawals, got.deposits)
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
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := s.do("POST", "/api/v1/orders", user, tc.key, tc.body)
			if w.Code >= 500 || w.Code < 400 || !strings.Contains(w.Body.String(), tc.slug) {
				t.Fatalf("%d %s; want %s", w.Code, w.Body, tc.slug)
			}
		})
	}
}

// busyOnce fails the first stock step with a busy lock, as a contended
// lock:stock:<sku> would after its wait timeout.
type busyOnce struct {
	Stock
	failed atomic.Bool
}

func (b *busyOnce) Purchase(ctx context.Context, u int64, sku string, q int64) (inventory.Purchase, error) {
	if b.failed.CompareAndSwap(false, true) {
		return inventory.Purchase{}, lockkit.ErrNotAcquired
	}
	return b.Stock.Purchase(ctx, u, sku, q)
}

// A 503 after the charge is refunded and not stored: the same key then
// places the order.
func TestServerErrorIsRefundedAndRetryable(t *testing.T) {
	s := newShop(t, func(st Stock) Stock { return &busyOnce{Stock: st} })
	key := s.token(user)
	const body = `{"sku":"widget","quantity":1}`
	if w := s.do("POST", "/api/v1/orders", user, key, body); w.Code != http.StatusServiceUnavailable {
		t.Fatalf("first: %d %s; want 503", w.Code, w.Body)
	}
	if got := s.state(); got.orders != 0 || got.balance != opening || got.withdrawals != 1 || got.deposits != 1 {
		t.Fatalf("after the 503: %+v; want no order, one charge refunded", got)
	}
	w := s.do("POST", "/api/v1/orders", user, key, body)
	if w.Code != http.StatusCreated || w.Header().Get(idem.ReplayedHeader) != "" {
		t.Fatalf("retry: %d %s; want a fresh 201", w.Code, w.Body)
	}
	if got := s.state(); got.orders != 1 || got.balance != opening-price || got.stock != stock-1 {
		t.Fatalf("after the retry: %+v", got)
	}
	s.auditOK()
}

// Without the idempotency layer (as when Redis lost the in-flight lock),
// the order row's unique key still places one order per key.
func TestUniqueKeyHoldsWithoutIdem(t *testing.T) {
	s := newShop(t, nil)
	ctx := context.Background()
	o, err := s.service.Place(ctx, user, "k1", "widget", 1)
	if err != nil {
		t.Fatal(err)
	}
	again, err := s.service.Place(ctx, user, "k1", "widget", 1)
	if err != nil || again.ID != o.ID || again.Status != StatusPlaced {
		t.Fatalf("second run: %+v, %v; want order %d", again, err, o.ID)
	}
	pending := Order{UserID: user, IdempotencyKey: "k2", SKU: "widget", Quantity: 1, AmountCents: price, Status: StatusPending}
	if _, err := s.orders.CreatePending(ctx, &pending); err != nil {
		t.Fatal(err)
	}
	if _, err := s.service.Place(ctx, user, "k2", "widget", 1); !errors.Is(err, ErrInProgress) {
		t.Fatalf("key of a pending order: %v; want ErrInProgress", err)
	}
	if got := s.state(); got.withdrawals != 1 || got.purchases != 1 {
		t.Fatalf("charged %d times, %d purchases; want 1 each", got.withdrawals, got.purchases)
	}
	// ErrInProgress is not stored: the key answers the real outcome later.
	key := s.token(user)
	if err := s.db.Exec("UPDATE orders SET idempotency_key = ? WHERE idempotency_key = 'k2'", key).Error; err != nil {
		t.Fatal(err)
	}
	for range 2 {
		w := s.do("POST", "/api/v1/orders", user, key, `{"sku":"widget","quantity":1}`)
		if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "order-in-progress") || w.Header().Get(idem.ReplayedHeader) != "" {
			t.Fatalf("pending order through HTTP: %d %s %v", w.Code, w.Body, w.Header())
		}
	}
	dup, err := s.orders.Duplicates(ctx)
	if err != nil || len(dup) != 0 {
		t.Fatalf("duplicates %v, %v", dup, err)
	}
}
