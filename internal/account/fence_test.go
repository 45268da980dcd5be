package account

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/instrument"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/optimistic"
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
	client := redis.NewClient(&redis.Options{Addr: redisAddr, ContextTimeoutEnabled: true})
	locker, err := redislock.New(client, redislock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Close(); client.Close() })

	reg := prometheus.NewRegistry()
	m := instrument.NewMetrics(reg, "redis")
	store := NewStore(db.DB)
	d := &Domain{Store: store, Service: NewService(store, Options{Locking: guard.Locking{
		Locker:      instrument.Wrap(lockkit.Reentrant(locker), instrument.Options{Backend: "redis", Metrics: m}),
		LockOptions: []lockkit.Option{lockkit.WithTTL(ttl), lockkit.WithWaitTimeout(10 * time.Second)},
		Metrics:     m,
	}})}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	// The row cmd/shop's table has for the refusal this test provokes.
	r.Use(problem.Errors(append(Problems(), problem.Mapping{Target: lockkit.ErrFenced,
		Status: http.StatusServiceUnavailable, Slug: "fenced", Title: "Write refused: stale lock", RetryAfter: 1})))
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

// databases are the SQL stores the fence is proven on: SQLite always,
// MariaDB when SHOP_TEST_MYSQL_DSN is set (required in CI), each test on a
// fresh database.
func databases() map[string]func(t *testing.T) *storage.DB {
	return map[string]func(t *testing.T) *storage.DB{
		"sqlite": func(t *testing.T) *storage.DB {
			return openDB(t, storage.Options{SQLitePath: t.TempDir() + "/acct.db"})
		},
		"mysql": func(t *testing.T) *storage.DB {
			return openDB(t, storage.Options{MySQLDSN: shoptest.MySQL(t), MaxConns: 5})
		},
	}
}

func openDB(t *testing.T, o storage.Options) *storage.DB {
	t.Helper()
	db, err := storage.Open(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Migrate(context.Background(), Models()...); err != nil {
		t.Fatal(err)
	}
	return db
}

// gate stops a store's Update between its decision and its write, where a
// paused process sits when its lease runs out, until released.
type gate struct {
	paused, wake chan struct{}
	release      func()
}

func pauseBeforeWrite(t *testing.T, s *Store) *gate {
	g := &gate{paused: make(chan struct{}), wake: make(chan struct{})}
	var once sync.Once
	g.release = func() { once.Do(func() { close(g.wake) }) }
	t.Cleanup(g.release) // a failed test must not strand the goroutine
	s.beforeWrite = func(context.Context) {
		close(g.paused)
		<-g.wake
	}
	return g
}

// update is one Update under fixed tokens that adds delta[i] to the i-th
// account; seen receives the balances it read.
type update struct {
	kind   string
	ids    []int64
	fences map[int64]uint64
	delta  []int64
}

func (u update) start(ctx context.Context, s *Store, seen *[]int64) <-chan error {
	done := make(chan error, 1)
	go func() {
		done <- s.Update(ctx, u.kind, u.ids, u.fences, func(_ context.Context, accts []*Account) error {
			for i, a := range accts {
				*seen = append(*seen, a.Balance)
				a.Balance += u.delta[i]
			}
			return nil
		})
	}()
	return done
}

// TestStaleWriteAfterNewerReadIsFenced is the lost update that a fence
// checked only at write time lets through (docs/faults.md, found 5): A
// (token 5) reads and decides, then stalls before its write past its lease;
// B (token 6) reads the same balance and decides; A's write lands, then B's
// overwrites it from its stale read. Every write beats the row's fence at
// the time it lands, yet A's ledger row explains money that is not in the
// balance. The store must refuse A's write: B has shown its token before
// reading, so A finds a newer fence when it writes.
func TestStaleWriteAfterNewerReadIsFenced(t *testing.T) {
	for _, tc := range []staleWriteCase{
		{"withdraw-deposit",
			update{"withdraw", []int64{1}, map[int64]uint64{1: 5}, []int64{-10}},
			update{"deposit", []int64{1}, map[int64]uint64{1: 6}, []int64{10}}},
		// A's transfer touches account 2, which B updates: A must claim both
		// rows before reading either.
		{"transfer-deposit",
			update{"transfer", []int64{1, 2}, map[int64]uint64{1: 5, 2: 5}, []int64{-10, 10}},
			update{"deposit", []int64{2}, map[int64]uint64{2: 6}, []int64{10}}},
	} {
		for dbName, open := range databases() {
			t.Run(tc.name+"/"+dbName, func(t *testing.T) { tc.run(t, open(t)) })
		}
	}
}

// staleWriteCase is A's stale update (token 5) and B's newer one (token 6).
type staleWriteCase struct {
	name string
	a, b update
}

func (tc staleWriteCase) run(t *testing.T, db *storage.DB) {
	ctx := context.Background()
	a, b := NewStore(db.DB), NewStore(db.DB) // two shop instances
	for id := int64(1); id <= 2; id++ {
		if _, err := a.Put(ctx, id, 100); err != nil {
			t.Fatal(err)
		}
	}
	// Token 4 wrote last.
	if err := db.DB.Exec("UPDATE accounts SET fence = 4").Error; err != nil {
		t.Fatal(err)
	}
	aErr, bErr := tc.interleave(t, ctx, a, b)

	if !errors.Is(aErr, lockkit.ErrFenced) {
		t.Errorf("A (token 5, stale): %v, want ErrFenced", aErr)
	}
	if bErr != nil {
		t.Errorf("B (token 6): %v, want success", bErr)
	}
	drift, err := a.Drift(ctx)
	if err != nil || len(drift) != 0 {
		t.Errorf("drift %v (%v), want none: balance = opening + ledger", drift, err)
	}
	for id, want := range map[int64]int64{1: 100, 2: 100} {
		if id == tc.b.ids[0] {
			want += tc.b.delta[0]
		}
		if got, err := a.Get(ctx, id); err != nil || got.Balance != want {
			t.Errorf("account %d: balance %d (%v), want %d: B's change only", id, got.Balance, err, want)
		}
	}
}

// interleave runs A up to its write, then B up to its write (reading the
// balance A has not changed yet), then lets A write, then B. It returns
// what each update returned.
func (tc staleWriteCase) interleave(t *testing.T, ctx context.Context, a, b *Store) (aErr, bErr error) {
	t.Helper()
	aGate, bGate := pauseBeforeWrite(t, a), pauseBeforeWrite(t, b)
	var aSeen, bSeen []int64
	aDone := tc.a.start(ctx, a, &aSeen)
	select {
	case <-aGate.paused:
	case err := <-aDone:
		t.Fatalf("A ended before its write: %v", err)
	}
	bDone := tc.b.start(ctx, b, &bSeen)
	select {
	case <-bGate.paused:
	case err := <-bDone:
		t.Fatalf("B ended before its write: %v", err)
	}
	if bSeen[0] != 100 {
		t.Fatalf("B read %d, want 100: the interleaving is not the one under test", bSeen[0])
	}
	aGate.release()
	aErr = <-aDone
	bGate.release()
	bErr = <-bDone
	return aErr, bErr
}

// TestPutBetweenALockedReadAndItsWriteFencesTheWrite: a holder (token 5)
// reads the balance and decides a deposit; before its write lands an
// admin PUT replaces the account. The PUT raises the row's version in its
// own statement, so the holder's write from the old balance is refused and the PUT's balance stands: the deposit was decided
// on an account that no longer exists.
func TestPutBetweenALockedReadAndItsWriteFencesTheWrite(t *testing.T) {
	for dbName, open := range databases() {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			db := open(t)
			s := NewStore(db.DB)
			if _, err := s.Put(ctx, 1, 100); err != nil {
				t.Fatal(err)
			}
			if err := db.DB.Exec("UPDATE accounts SET fence = 4").Error; err != nil {
				t.Fatal(err)
			}
			g := pauseBeforeWrite(t, s)
			var seen []int64
			done := update{"deposit", []int64{1}, map[int64]uint64{1: 5}, []int64{10}}.start(ctx, s, &seen)
			select {
			case <-g.paused:
			case err := <-done:
				t.Fatalf("the deposit ended before its write: %v", err)
			}
			if _, err := NewStore(db.DB).Put(ctx, 1, 600); err != nil {
				t.Fatal(err)
			}
			g.release()
			if err := <-done; !errors.Is(err, optimistic.ErrConflict) {
				t.Errorf("the deposit read before the PUT: %v, want optimistic.ErrConflict", err)
			}
			if a, err := s.Get(ctx, 1); err != nil || a.Balance != 600 {
				t.Errorf("balance %d (%v), want 600: the PUT's", a.Balance, err)
			}
			if drift, err := s.Drift(ctx); err != nil || len(drift) != 0 {
				t.Errorf("drift %v (%v), want none", drift, err)
			}
		})
	}
}

// TestResetBetweenALockedReadAndItsWriteFencesTheWrite: a holder (token 5)
// reads a balance of 100 and decides a deposit; before its write lands an
// admin reset lays down the fixture (account 1 at 100,000). The reset
// raises the version of every row it keeps, in its own transaction, so the
// holder's write from the pre-reset balance is refused and the fixture's
// balance stands.
func TestResetBetweenALockedReadAndItsWriteFencesTheWrite(t *testing.T) {
	for dbName, open := range databases() {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			db := open(t)
			s := NewStore(db.DB)
			if _, err := s.Put(ctx, 1, 100); err != nil {
				t.Fatal(err)
			}
			if err := db.DB.Exec("UPDATE accounts SET fence = 4").Error; err != nil {
				t.Fatal(err)
			}
			g := pauseBeforeWrite(t, s)
			var seen []int64
			done := update{"deposit", []int64{1}, map[int64]uint64{1: 5}, []int64{10}}.start(ctx, s, &seen)
			select {
			case <-g.paused:
			case err := <-done:
				t.Fatalf("the deposit ended before its write: %v", err)
			}
			if err := NewStore(db.DB).Reset(ctx, "default"); err != nil {
				t.Fatal(err)
			}
			g.release()
			if err := <-done; !errors.Is(err, optimistic.ErrConflict) {
				t.Errorf("the deposit read before the reset: %v, want optimistic.ErrConflict", err)
			}
			if a, err := s.Get(ctx, 1); err != nil || a.Balance != 100_000 {
				t.Errorf("balance %d (%v), want 100000: the fixture's", a.Balance, err)
			}
			if drift, err := s.Drift(ctx); err != nil || len(drift) != 0 {
				t.Errorf("drift %v (%v), want none", drift, err)
			}
		})
	}
}
