package account

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/optimistic"
	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/redis/go-redis/v9"
)

// accountAPI drives one account's routes over a handler, as user 1.
type accountAPI struct {
	handler http.Handler
	token   string
}

func newAccountAPI(t *testing.T, store *Store, svc Service) *accountAPI {
	t.Helper()
	d := &Domain{Store: store, Service: svc}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(problem.Errors(Problems()))
	a := auth.New([]byte(secret), "admin")
	d.Register(r.Group("/api/v1", a.User()), r.Group("/admin/v1", a.Admin()))
	return &accountAPI{handler: r, token: shoptest.Token(t, secret, 1)}
}

// do sends method to /api/v1/accounts/1<path>; ifMatch nil sends no
// If-Match header.
func (api *accountAPI) do(method, path string, body string, ifMatch *string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, "/api/v1/accounts/1"+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+api.token)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if ifMatch != nil {
		req.Header.Set("If-Match", *ifMatch)
	}
	rec := httptest.NewRecorder()
	api.handler.ServeHTTP(rec, req)
	return rec
}

func (api *accountAPI) etag(t *testing.T) string {
	t.Helper()
	rec := api.do("GET", "", "", nil)
	if rec.Code != http.StatusOK {
		t.Fatalf("GET: %d %s", rec.Code, rec.Body)
	}
	return rec.Header().Get("ETag")
}

// GET answers the account's version as a strong ETag; a deposit or
// withdrawal with If-Match applies only while the account is still at a
// version it names. A retry of a change that applied gets 412 and changes
// nothing; a malformed If-Match gets 400 and changes nothing.
func TestIfMatchAppliesOnlyAtTheNamedVersion(t *testing.T) {
	ctx := context.Background()
	store := sqliteStore(t)
	api := newAccountAPI(t, store, NewService(store, Options{Locking: guard.Locking{Locker: lockkit.None()}}))
	if _, err := store.Put(ctx, 1, 1000); err != nil {
		t.Fatal(err)
	}
	first := api.etag(t)
	if a, _ := store.Get(ctx, 1); first != ETag(a.Version) || !strings.HasPrefix(first, `"`) {
		t.Fatalf("GET's ETag %q, want the strong tag of version %d", first, a.Version)
	}
	tag := func(s string) *string { return &s }
	current := func() *string { return tag(api.etag(t)) }

	for _, tc := range []struct {
		name    string
		op      string // "deposit" or "withdraw"
		ifMatch func() *string
		status  int
		slug    string // for a problem
		detail  string // a part of the problem's detail
		moves   int64  // what the balance moves by
	}{
		{name: "deposit-200-if-match", op: "deposit", ifMatch: func() *string { return tag(first) }, status: 200, moves: 100},
		{name: "deposit-412-retry-of-applied", op: "deposit", ifMatch: func() *string { return tag(first) }, status: 412,
			slug: "precondition-failed", detail: "If-Match asks for " + first},
		{name: "withdraw-412-stale", op: "withdraw", ifMatch: func() *string { return tag(first) }, status: 412, slug: "precondition-failed"},
		{name: "withdraw-200-current", op: "withdraw", ifMatch: current, status: 200, moves: -100},
		{name: "deposit-200-list", op: "deposit", ifMatch: func() *string { return tag(`"999", ` + api.etag(t)) }, status: 200, moves: 100},
		{name: "deposit-200-star", op: "deposit", ifMatch: func() *string { return tag("*") }, status: 200, moves: 100},
		{name: "deposit-200-no-header", op: "deposit", ifMatch: func() *string { return nil }, status: 200, moves: 100},
		{name: "deposit-412-weak", op: "deposit", ifMatch: func() *string { return tag("W/" + api.etag(t)) }, status: 412, slug: "precondition-failed"},
		{name: "deposit-412-not-a-version", op: "deposit", ifMatch: func() *string { return tag(`"abc"`) }, status: 412, slug: "precondition-failed"},
		{name: "deposit-400-unquoted", op: "deposit", ifMatch: func() *string { return tag(strings.Trim(api.etag(t), `"`)) }, status: 400,
			slug: "invalid-input", detail: "an entity-tag is quoted"},
		{name: "deposit-400-unterminated", op: "deposit", ifMatch: func() *string { return tag(`"5`) }, status: 400,
			slug: "invalid-input", detail: "no closing quote"},
		{name: "deposit-400-no-comma", op: "deposit", ifMatch: func() *string { return tag(`"5" "6"`) }, status: 400,
			slug: "invalid-input", detail: "separated by commas"},
		{name: "deposit-400-empty", op: "deposit", ifMatch: func() *string { return tag("") }, status: 400,
			slug: "invalid-input", detail: "If-Match is empty"},
		{name: "withdraw-400-star-in-list", op: "withdraw", ifMatch: func() *string { return tag(`*, "5"`) }, status: 400, slug: "invalid-input"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, _ := store.Get(ctx, 1)
			rec := api.do("POST", "/"+tc.op, `{"amount_cents":100}`, tc.ifMatch())
			if rec.Code != tc.status {
				t.Fatalf("%d %s, want %d", rec.Code, rec.Body, tc.status)
			}
			if tc.slug != "" {
				var p problem.Details
				if rec.Header().Get("Content-Type") != problem.ContentType {
					t.Errorf("Content-Type %q, want %s", rec.Header().Get("Content-Type"), problem.ContentType)
				}
				if err := json.Unmarshal(rec.Body.Bytes(), &p); err != nil || p.Type != problem.TypeBase+tc.slug || !strings.Contains(p.Detail, tc.detail) {
					t.Errorf("problem %+v (%v), want type %s with %q in its detail", p, err, tc.slug, tc.detail)
				}
			}
			after, _ := store.Get(ctx, 1)
			if got := after.Balance - before.Balance; got != tc.moves {
				t.Errorf("the balance moved by %d, want %d", got, tc.moves)
			}
			if (after.Version != before.Version) != (tc.moves != 0) {
				t.Errorf("version %d → %d after a change of %d", before.Version, after.Version, tc.moves)
			}
		})
	}
	if d, err := store.Drift(ctx); err != nil || len(d) != 0 {
		t.Errorf("drift %v (%v)", d, err)
	}
}

// Clients that all read the same ETag send a deposit with it at once:
// exactly one applies and the others get 412, under every strategy and
// lock, the unsafe none baseline included (it loses unconditional updates,
// but an If-Match write lands only over the version it names). Where
// nothing serializes the requests, every one of them has read the balance
// before any writes.
func TestIfMatchRaceAppliesExactlyOnce(t *testing.T) {
	const clients = 8
	for dbName, newDB := range databases() {
		for _, strategy := range []struct {
			name     string
			service  func(t *testing.T, store *Store) Service
			unlocked bool // nothing serializes the read-modify-writes
		}{
			{"lock-redis", func(t *testing.T, store *Store) Service {
				client := redis.NewClient(&redis.Options{Addr: shoptest.Env(t, "SHOP_TEST_REDIS_ADDR"), ContextTimeoutEnabled: true})
				locker, err := redislock.New(client, redislock.WithPrefix(shoptest.Prefix("account")))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { locker.Close(); client.Close() })
				return NewService(store, Options{Locking: guard.Locking{Locker: lockkit.Reentrant(locker),
					LockOptions: []lockkit.Option{lockkit.WithWaitTimeout(30 * time.Second)}}})
			}, false},
			{"lock-local", func(t *testing.T, store *Store) Service {
				locker := local.New()
				t.Cleanup(func() { locker.Close() })
				return NewService(store, Options{Locking: guard.Locking{Locker: locker,
					LockOptions: []lockkit.Option{lockkit.WithWaitTimeout(30 * time.Second)}}})
			}, false},
			{"lock-none", func(_ *testing.T, store *Store) Service {
				return NewService(store, Options{Locking: guard.Locking{Locker: lockkit.None()}})
			}, true},
			{"optimistic", func(_ *testing.T, store *Store) Service {
				return NewService(store, Options{Strategy: StrategyOptimistic, Retry: optimistic.Retry{Policy: patient}})
			}, true},
		} {
			t.Run(dbName+"/"+strategy.name, func(t *testing.T) {
				ctx := context.Background()
				store := NewStore(newDB(t).DB)
				api := newAccountAPI(t, store, strategy.service(t, store))
				if _, err := store.Put(ctx, 1, 1000); err != nil {
					t.Fatal(err)
				}
				etag := api.etag(t)
				if strategy.unlocked {
					store.beforeWrite = barrier(clients)
				}
				codes := make(chan int, clients)
				var wg sync.WaitGroup
				start := make(chan struct{})
				for range clients {
					wg.Go(func() {
						<-start
						codes <- api.do("POST", "/deposit", `{"amount_cents":100}`, &etag).Code
					})
				}
				close(start)
				wg.Wait()
				close(codes)
				count := map[int]int{}
				for c := range codes {
					count[c]++
				}
				if count[http.StatusOK] != 1 || count[http.StatusPreconditionFailed] != clients-1 {
					t.Errorf("answers %v, want one 200 and %d 412", count, clients-1)
				}
				if a, _ := store.Get(ctx, 1); a.Balance != 1100 {
					t.Errorf("balance %d, want 1100: one deposit of 100", a.Balance)
				}
				if d, err := store.Drift(ctx); err != nil || len(d) != 0 {
					t.Errorf("drift %v (%v)", d, err)
				}
			})
		}
	}
}

// barrier holds the first n callers until all n have come; later callers
// pass at once.
func barrier(n int) func(context.Context) {
	var mu sync.Mutex
	all := make(chan struct{})
	came := 0
	return func(context.Context) {
		mu.Lock()
		came++
		if came == n {
			close(all)
		}
		mu.Unlock()
		<-all
	}
}
