package account

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/lockmetrics"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
)

const secret = "account-test-secret-0123456789abcdef"

// instance is one shop's account stack: its own Redis client and locker,
// its own store value, the shared database.
type instance struct {
	store   *Store
	handler http.Handler
	reg     *prometheus.Registry
}

func newInstance(t *testing.T, db *storage.DB, redisAddr, prefix string, ttl time.Duration) *instance {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: redisAddr})
	locker := redislock.New(client, redislock.WithPrefix(prefix))
	t.Cleanup(func() { locker.Close(); client.Close() })

	reg := prometheus.NewRegistry()
	m := lockmetrics.New(reg, "redis")
	store := NewStore(db.DB)
	d := &Domain{Store: store, Service: NewService(store, Options{
		Locker:      m.Wrap(lockkit.Reentrant(locker)),
		LockOptions: []lockkit.Option{lockkit.WithTTL(ttl), lockkit.WithWaitTimeout(10 * time.Second)},
		Metrics:     m,
	})}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	a := auth.New([]byte(secret), "admin")
	d.Register(r.Group("/api/v1", a.User()), r.Group("/admin/v1", a.Admin()))
	return &instance{store: store, handler: r, reg: reg}
}

func (in *instance) withdraw(t *testing.T, token string, amount string) *httptest.ResponseRecorder {
	req := httptest.NewRequest("POST", "/api/v1/accounts/1/withdraw", strings.NewReader(`{"amount_cents":`+amount+`}`))
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	in.handler.ServeHTTP(rec, req)
	return rec
}

// TestPausedHolderIsFenced: instance A holds lock:account:1, has read the
// balance and decided, and pauses right before its write (as a GC pause or
// a SIGSTOP would stop it) past its lease. Instance B takes the lock and
// writes. When A wakes, its write carries the older token and the store
// refuses it: A's client gets 503 problem+json (nothing was applied; a
// retry will work), B's withdrawal stands, and the balance is exact.
func TestPausedHolderIsFenced(t *testing.T) {
	ctx := context.Background()
	db, err := storage.Open(ctx, storage.Options{MySQLDSN: shoptest.MySQL(t), MaxConns: 5})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Migrate(ctx, Models()...); err != nil {
		t.Fatal(err)
	}
	redisAddr := shoptest.Env(t, "SHOP_TEST_REDIS_ADDR")
	prefix := shoptest.Prefix("account")
	const ttl = 300 * time.Millisecond
	a := newInstance(t, db, redisAddr, prefix, ttl)
	b := newInstance(t, db, redisAddr, prefix, ttl)
	if _, err := a.store.Put(ctx, 1, 1000); err != nil {
		t.Fatal(err)
	}

	paused, wake := make(chan struct{}), make(chan struct{})
	a.store.beforeWrite = func(context.Context) {
		close(paused)
		<-wake
	}
	tok := shoptest.Token(t, secret, 1)
	aDone := make(chan *httptest.ResponseRecorder)
	go func() { aDone <- a.withdraw(t, tok, "300") }()
	<-paused

	// B waits for A's lease to run out (A's key expires in Redis after
	// 300 ms), then withdraws with a newer token.
	if rec := b.withdraw(t, tok, "200"); rec.Code != http.StatusOK {
		t.Fatalf("B: %d %s", rec.Code, rec.Body)
	}
	close(wake)
	rec := <-aDone

	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Content-Type") != problem.ContentType ||
		rec.Header().Get("Retry-After") == "" {
		t.Fatalf("A: %d %v %s; want 503 problem+json with Retry-After", rec.Code, rec.Header(), rec.Body)
	}
	var p problem.Details
	if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Type != problem.TypeBase+"fenced" {
		t.Errorf("A's problem: %+v (%v), want type fenced", p, err)
	}
	got, err := a.store.Get(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got.Balance != 800 {
		t.Errorf("balance %d, want 800: B's withdrawal only", got.Balance)
	}
	drift, err := a.store.Drift(ctx)
	if err != nil || len(drift) != 0 {
		t.Errorf("drift %v (%v), want none", drift, err)
	}
	fenced := counter(t, a.reg, "shop_fenced_writes_total")
	if fenced != 1 {
		t.Errorf("shop_fenced_writes_total on A = %v, want 1", fenced)
	}
}

// counter sums the series of a counter family in reg.
func counter(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}
