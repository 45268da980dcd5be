package inventory

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/lockkit/registry"
	"github.com/lockbench/shop/internal/optimistic"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// database/sql's connection opener lives as long as a *sql.DB; the
		// tests close theirs, but the driver's goroutine ends asynchronously.
		goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"),
		// miniredis (the embedded Redis) closes its listener asynchronously.
		goleak.IgnoreAnyFunction("github.com/alicebob/miniredis/v2/server.(*Server).servePeer"),
	)
}

// databases are the SQL stores every strategy is proven on: SQLite always,
// MariaDB when SHOP_TEST_MYSQL_DSN is set (required in CI).
func databases(t *testing.T) map[string]func(t *testing.T) *storage.DB {
	dbs := map[string]func(t *testing.T) *storage.DB{
		"sqlite": func(t *testing.T) *storage.DB { return open(t, storage.Options{SQLitePath: t.TempDir() + "/inv.db"}) },
	}
	if os.Getenv("SHOP_TEST_MYSQL_DSN") != "" || os.Getenv("CI") == "true" {
		dbs["mysql"] = func(t *testing.T) *storage.DB {
			return open(t, storage.Options{MySQLDSN: shoptest.MySQL(t), MaxConns: 20})
		}
	}
	return dbs
}

func open(t *testing.T, o storage.Options) *storage.DB {
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

func mirror(t *testing.T) *Mirror {
	t.Helper()
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { c.Close() })
	return NewMirror(c, "inventory-test:")
}

// buyAll sends n purchases of one unit at once (one channel releases them
// all) and counts the outcomes.
func buyAll(t *testing.T, svc Service, sku string, n int, user func(i int) int64) (sold, soldOut, limited int) {
	t.Helper()
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, err := svc.Purchase(context.Background(), user(i), sku, 1)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				sold++
			case errors.Is(err, ErrSoldOut):
				soldOut++
			case errors.Is(err, ErrLimitExceeded):
				limited++
			default:
				t.Errorf("purchase: %v", err)
			}
		}()
	}
	close(start)
	wg.Wait()
	return sold, soldOut, limited
}

// TestStrategiesSellExactlyTheStock: 60 concurrent buyers, stock 20. Each
// safe strategy sells exactly 20 and the audit finds nothing; the per-user
// limit holds when one user races with himself.
func TestStrategiesSellExactlyTheStock(t *testing.T) {
	for dbName, newDB := range databases(t) {
		for _, strategy := range []string{StrategyLock, StrategyAtomicSQL, StrategyAtomicRedis} {
			t.Run(dbName+"/"+strategy, func(t *testing.T) {
				ctx := context.Background()
				db := newDB(t)
				var m *Mirror
				if strategy == StrategyAtomicRedis {
					m = mirror(t)
				}
				store := NewStore(db.DB, m)
				locker := local.New()
				defer locker.Close()
				svc, err := NewService(store, Options{Strategy: strategy, Mirror: m,
					Locking: guard.Locking{Locker: locker, CriticalSectionDelay: time.Millisecond}})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := store.Put(ctx, Product{SKU: "hot", Name: "hot", Stock: 20, PriceCents: 1}); err != nil {
					t.Fatal(err)
				}
				sold, soldOut, _ := buyAll(t, svc, "hot", 60, func(i int) int64 { return int64(i + 1) })
				if sold != 20 || soldOut != 40 {
					t.Errorf("sold %d, sold out %d; want 20 and 40", sold, soldOut)
				}
				p, err := store.Get(ctx, "hot")
				if err != nil || p.Stock != 0 {
					t.Errorf("stock %d (%v), want 0", p.Stock, err)
				}
				assertNoDrift(t, store)

				if _, err := store.Put(ctx, Product{SKU: "lim", Name: "lim", Stock: 100, PriceCents: 1, PerUserLimit: 3}); err != nil {
					t.Fatal(err)
				}
				sold, _, limited := buyAll(t, svc, "lim", 12, func(int) int64 { return 7 })
				if sold != 3 || limited != 9 {
					t.Errorf("one user, limit 3: sold %d, limited %d; want 3 and 9", sold, limited)
				}
				assertNoDrift(t, store)
			})
		}
	}
}

// TestNoLockOversells is the baseline: read-check-write with lockkit.None
// and a 5 ms critical section sells more than the stock, and the audit
// counts exactly the excess.
func TestNoLockOversells(t *testing.T) {
	ctx := context.Background()
	db := open(t, storage.Options{SQLitePath: t.TempDir() + "/inv.db"})
	store := NewStore(db.DB, nil)
	svc, err := NewService(store, Options{Strategy: StrategyLock,
		Locking: guard.Locking{Locker: lockkit.None(), CriticalSectionDelay: 5 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Put(ctx, Product{SKU: "hot", Name: "hot", Stock: 20, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	sold, _, _ := buyAll(t, svc, "hot", 60, func(i int) int64 { return int64(i + 1) })
	over, err := store.Oversold(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("without a lock: %d sold of 20, oversold %v", sold, over)
	if sold <= 20 || over["hot"] != int64(sold-20) {
		t.Errorf("sold %d, oversold %v; want more than 20 sold and the excess counted", sold, over)
	}
}

// TestStaleFenceIsRefused: a write whose token is not above the row's is
// refused and changes nothing, including a replay under the same token.
func TestStaleFenceIsRefused(t *testing.T) {
	ctx := context.Background()
	db := open(t, storage.Options{SQLitePath: t.TempDir() + "/inv.db"})
	store := NewStore(db.DB, nil)
	if _, err := store.Put(ctx, Product{SKU: "f", Name: "f", Stock: 10, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	take := func(fence uint64) error {
		p := Purchase{SKU: "f", UserID: 1, Quantity: 1, Strategy: StrategyLock}
		return store.Update(ctx, &p, fence, func(_ context.Context, prod *Product) error { prod.Stock--; return nil })
	}
	if err := take(5); err != nil {
		t.Fatal(err)
	}
	for _, stale := range []uint64{4, 5} {
		if err := take(stale); !errors.Is(err, lockkit.ErrFenced) {
			t.Errorf("token %d after 5: %v, want ErrFenced", stale, err)
		}
	}
	if err := take(6); err != nil {
		t.Fatal(err)
	}
	p, _ := store.Get(ctx, "f")
	if p.Stock != 8 {
		t.Errorf("stock %d, want 8", p.Stock)
	}
	assertNoDrift(t, store)
}

func assertNoDrift(t *testing.T, store *Store) {
	t.Helper()
	ctx := context.Background()
	for name, check := range map[string]func(context.Context) (map[string]int64, error){
		"oversold": store.Oversold, "stock drift": store.StockDrift,
		"over limit": store.OverLimit, "miscounted limit": store.MiscountedLimit,
	} {
		d, err := check(ctx)
		if err != nil || len(d) != 0 {
			t.Errorf("%s: %v (%v), want none", name, d, err)
		}
	}
}

// TestStaleWriteAfterNewerReadIsFenced is the lost decrement that a fence
// checked only at write time lets through (docs/faults.md, found 5): A
// (token 5) reads stock 10 and decides 9, then stalls before its write past
// its lease; B (token 6) reads 10 and decides 9; A's write lands, then B's
// overwrites it. Two units are sold and one is taken from the stock: the
// other will be sold again. The store must refuse A's write: B has shown
// its token before reading, so A finds a newer fence when it writes.
func TestStaleWriteAfterNewerReadIsFenced(t *testing.T) {
	for dbName, newDB := range databases(t) {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			db := newDB(t)
			a, b := NewStore(db.DB, nil), NewStore(db.DB, nil) // two shop instances
			if _, err := a.Put(ctx, Product{SKU: "race", Name: "race", Stock: 10, PriceCents: 1}); err != nil {
				t.Fatal(err)
			}
			// Token 4 wrote last.
			if err := db.DB.Exec("UPDATE products SET fence = 4").Error; err != nil {
				t.Fatal(err)
			}
			type buyer struct {
				paused, wake chan struct{}
				release      func()
				seen         int64
				done         chan error
			}
			start := func(s *Store, user int64, fence uint64) *buyer {
				by := &buyer{paused: make(chan struct{}), wake: make(chan struct{}), done: make(chan error, 1)}
				var once sync.Once
				by.release = func() { once.Do(func() { close(by.wake) }) }
				t.Cleanup(by.release) // a failed test must not strand the goroutine
				s.beforeWrite = func(context.Context) {
					close(by.paused)
					<-by.wake
				}
				go func() {
					p := Purchase{SKU: "race", UserID: user, Quantity: 1, Strategy: StrategyLock}
					by.done <- s.Update(ctx, &p, fence, func(_ context.Context, prod *Product) error {
						by.seen = prod.Stock
						prod.Stock--
						return nil
					})
				}()
				select {
				case <-by.paused:
				case err := <-by.done:
					t.Fatalf("user %d ended before its write: %v", user, err)
				}
				return by
			}
			stale := start(a, 1, 5)
			newer := start(b, 2, 6)
			if newer.seen != 10 {
				t.Fatalf("B read stock %d, want 10: the interleaving is not the one under test", newer.seen)
			}
			stale.release()
			aErr := <-stale.done
			newer.release()
			bErr := <-newer.done

			if !errors.Is(aErr, lockkit.ErrFenced) {
				t.Errorf("A (token 5, stale): %v, want ErrFenced", aErr)
			}
			if bErr != nil {
				t.Errorf("B (token 6): %v, want success", bErr)
			}
			if p, err := a.Get(ctx, "race"); err != nil || p.Stock != 9 {
				t.Errorf("stock %d (%v), want 9: B's unit only", p.Stock, err)
			}
			assertNoDrift(t, a)
		})
	}
}

// putAndSell puts the products open and lim (limit 2 per user), which
// starts a new sale of each, sells 3 units of open to 3 users and tries 3
// of lim for one, and wants the audit without drift.
func putAndSell(t *testing.T, store *Store, svc Service, sale int) {
	t.Helper()
	for _, p := range []Product{
		{SKU: "open", Name: "open", Stock: 10, PriceCents: 1},
		{SKU: "lim", Name: "lim", Stock: 10, PriceCents: 1, PerUserLimit: 2},
	} {
		if _, err := store.Put(context.Background(), p); err != nil {
			t.Fatal(err)
		}
	}
	if sold, soldOut, _ := buyAll(t, svc, "open", 3, func(i int) int64 { return int64(i + 1) }); sold != 3 || soldOut != 0 {
		t.Errorf("sale %d: sold %d, sold out %d; want 3 and 0", sale, sold, soldOut)
	}
	if sold, _, limited := buyAll(t, svc, "lim", 3, func(int) int64 { return 7 }); sold != 2 || limited != 1 {
		t.Errorf("sale %d, one user, limit 2: sold %d, limited %d; want 2 and 1", sale, sold, limited)
	}
	assertNoDrift(t, store)
}

// TestANewSaleCountsOnlyItsOwnPurchases: an admin PUT starts a new sale.
// The old sale's purchase rows stay (orders reconcile against them) but
// the stock audit and the per-user limit count the new sale's only,
// whichever strategy wrote them.
func TestANewSaleCountsOnlyItsOwnPurchases(t *testing.T) {
	for dbName, newDB := range databases(t) {
		for _, tc := range []struct {
			strategy string
			combine  int
		}{{StrategyLock, 0}, {StrategyLock, 4}, {StrategyAtomicSQL, 0}, {StrategyAtomicRedis, 0}, {StrategyOptimistic, 0}} {
			t.Run(fmt.Sprintf("%s/%s/combine=%d", dbName, tc.strategy, tc.combine), func(t *testing.T) {
				ctx := context.Background()
				db := newDB(t)
				var m *Mirror
				if tc.strategy == StrategyAtomicRedis {
					m = mirror(t)
				}
				store := NewStore(db.DB, m)
				locker := local.New()
				defer locker.Close()
				svc, err := NewService(store, Options{Strategy: tc.strategy, Mirror: m, Combine: tc.combine,
					Locking: guard.Locking{Locker: locker}})
				if err != nil {
					t.Fatal(err)
				}
				for sale := range 2 {
					putAndSell(t, store, svc, sale)
				}
				for sku, want := range map[string]int64{"open": 7, "lim": 8} {
					if p, err := store.Get(ctx, sku); err != nil || p.Stock != want {
						t.Errorf("%s: stock %d (%v), want %d", sku, p.Stock, err, want)
					}
				}
				var rows int64
				if err := db.DB.Model(&Purchase{}).Count(&rows).Error; err != nil || rows != 10 {
					t.Errorf("%d purchase rows (%v), want both sales' 10", rows, err)
				}
			})
		}
	}
}

// TestPutBetweenALockedReadAndItsWriteFencesTheWrite: a holder (token 5)
// reads the stock and decides a sale; before its write lands an admin PUT
// restocks the product. The PUT raises the row's version in its own
// statement, so the holder's write from the old stock is refused and
// the restock stands.
func TestPutBetweenALockedReadAndItsWriteFencesTheWrite(t *testing.T) {
	for dbName, newDB := range databases(t) {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			db := newDB(t)
			s := NewStore(db.DB, nil)
			if _, err := s.Put(ctx, Product{SKU: "put", Name: "put", Stock: 10, PriceCents: 1}); err != nil {
				t.Fatal(err)
			}
			if err := db.DB.Exec("UPDATE products SET fence = 4").Error; err != nil {
				t.Fatal(err)
			}
			paused, wake := make(chan struct{}), make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(wake) }) }
			t.Cleanup(release)
			s.beforeWrite = func(context.Context) { close(paused); <-wake }
			done := make(chan error, 1)
			go func() {
				p := Purchase{SKU: "put", UserID: 1, Quantity: 1, Strategy: StrategyLock}
				done <- s.Update(ctx, &p, 5, func(_ context.Context, prod *Product) error { prod.Stock--; return nil })
			}()
			select {
			case <-paused:
			case err := <-done:
				t.Fatalf("the sale ended before its write: %v", err)
			}
			if _, err := NewStore(db.DB, nil).Put(ctx, Product{SKU: "put", Name: "put", Stock: 100, PriceCents: 1}); err != nil {
				t.Fatal(err)
			}
			release()
			if err := <-done; !errors.Is(err, optimistic.ErrConflict) {
				t.Errorf("the sale read before the PUT: %v, want optimistic.ErrConflict", err)
			}
			if p, err := s.Get(ctx, "put"); err != nil || p.Stock != 100 {
				t.Errorf("stock %d (%v), want 100: the PUT's", p.Stock, err)
			}
			assertNoDrift(t, s)
		})
	}
}

// TestCaseVariantsOfASKUShareOneLock: 40 one-unit purchases of one product
// spread over four spellings of its SKU. A SKU names one lock key and one
// row only in its canonical (lower-case) form: the other spellings are
// refused before they name a lock, so whatever the lock (fenced: local and
// redis; unfenced: memcached), combined or not, under atomic-redis's
// mirror and under the optimistic strategy, what is sold is exactly what the stock lost, and no purchase is
// refused as fenced.
func TestCaseVariantsOfASKUShareOneLock(t *testing.T) {
	spellings := []string{"phone-x", "PHONE-X", "Phone-x", "pHONE-X"}
	lockers := map[string]func(t *testing.T) lockkit.Locker{
		"local": func(*testing.T) lockkit.Locker { return local.New() },
		"redis": func(t *testing.T) lockkit.Locker {
			c := redis.NewClient(&redis.Options{Addr: shoptest.Env(t, "SHOP_TEST_REDIS_ADDR"), ContextTimeoutEnabled: true})
			t.Cleanup(func() { c.Close() })
			return openBackend(t, "redis", registry.Settings{Redis: c})
		},
		"memcached": func(t *testing.T) lockkit.Locker {
			return openBackend(t, "memcached", registry.Settings{MemcachedAddrs: []string{shoptest.Env(t, "SHOP_TEST_MEMCACHED_ADDR")}})
		},
	}
	variants := map[string]struct {
		locker string
		o      Options
	}{
		"lock-local":     {"local", Options{Strategy: StrategyLock}},
		"lock-redis":     {"redis", Options{Strategy: StrategyLock}},
		"lock-memcached": {"memcached", Options{Strategy: StrategyLock}},
		"lock-combined":  {"local", Options{Strategy: StrategyLock, Combine: 8}},
		"atomic-redis":   {"local", Options{Strategy: StrategyAtomicRedis}},
		"optimistic":     {"local", Options{Strategy: StrategyOptimistic, Retry: optimistic.Retry{Policy: patient}}},
	}
	for dbName, newDB := range databases(t) {
		for name, v := range variants {
			t.Run(dbName+"/"+name, func(t *testing.T) {
				ctx := context.Background()
				o := v.o
				if o.Strategy == StrategyAtomicRedis {
					o.Mirror = mirror(t)
				}
				store := NewStore(newDB(t).DB, o.Mirror)
				o.Locker, o.CriticalSectionDelay = lockers[v.locker](t), 5*time.Millisecond
				defer o.Locker.Close()
				svc, err := NewService(store, o)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := store.Put(ctx, Product{SKU: "phone-x", Name: "phone", Stock: 40, PriceCents: 1}); err != nil {
					t.Fatal(err)
				}
				var (
					mu      sync.Mutex
					wg      sync.WaitGroup
					start   = make(chan struct{})
					answers = map[string]int{}
				)
				for i := range 40 {
					wg.Go(func() {
						<-start
						sku := spellings[i%len(spellings)]
						_, err := svc.Purchase(ctx, int64(i+1), sku, 1)
						mu.Lock()
						defer mu.Unlock()
						switch {
						case err == nil:
							answers[sku+" sold"]++
						case errors.Is(err, ErrNotFound) && sku != "phone-x":
							answers[sku+" not found"]++
						default:
							answers[fmt.Sprintf("%s %v", sku, err)]++
						}
					})
				}
				close(start)
				wg.Wait()
				want := map[string]int{"phone-x sold": 10, "PHONE-X not found": 10, "Phone-x not found": 10, "pHONE-X not found": 10}
				if fmt.Sprint(answers) != fmt.Sprint(want) {
					t.Errorf("answers %v, want %v", answers, want)
				}
				if p, err := store.Get(ctx, "phone-x"); err != nil || p.Stock != 30 {
					t.Errorf("stock %d (%v), want 30", p.Stock, err)
				}
				assertNoDrift(t, store)
			})
		}
	}
}

// openBackend opens the lock backend name of the registry on its test
// server, under a key prefix of its own.
func openBackend(t *testing.T, name string, s registry.Settings) lockkit.Locker {
	t.Helper()
	s.KeyPrefix = shoptest.Prefix("inventory")
	l, err := registry.Open(context.Background(), name, s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TestResetBetweenALockedReadAndItsWriteFencesTheWrite: a holder (token 5)
// reads a stock of 10 and decides a sale; before its write lands an admin
// reset lays down the fixture (phone-x at 50). The reset raises the
// version of every row it keeps and starts a new sale, in its own
// transaction, so the holder's write from the pre-reset stock is refused
// and the fixture's stock stands.
func TestResetBetweenALockedReadAndItsWriteFencesTheWrite(t *testing.T) {
	for dbName, newDB := range databases(t) {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			db := newDB(t)
			s := NewStore(db.DB, nil)
			if _, err := s.Put(ctx, Product{SKU: "phone-x", Name: "phone", Stock: 10, PriceCents: 1}); err != nil {
				t.Fatal(err)
			}
			if err := db.DB.Exec("UPDATE products SET fence = 4").Error; err != nil {
				t.Fatal(err)
			}
			paused, wake := make(chan struct{}), make(chan struct{})
			var once sync.Once
			release := func() { once.Do(func() { close(wake) }) }
			t.Cleanup(release)
			s.beforeWrite = func(context.Context) { close(paused); <-wake }
			done := make(chan error, 1)
			go func() {
				p := Purchase{SKU: "phone-x", UserID: 1, Quantity: 1, Strategy: StrategyLock}
				done <- s.Update(ctx, &p, 5, func(_ context.Context, prod *Product) error { prod.Stock--; return nil })
			}()
			select {
			case <-paused:
			case err := <-done:
				t.Fatalf("the sale ended before its write: %v", err)
			}
			if err := NewStore(db.DB, nil).Reset(ctx, "default"); err != nil {
				t.Fatal(err)
			}
			release()
			if err := <-done; !errors.Is(err, optimistic.ErrConflict) {
				t.Errorf("the sale read before the reset: %v, want optimistic.ErrConflict", err)
			}
			if p, err := s.Get(ctx, "phone-x"); err != nil || p.Stock != 50 {
				t.Errorf("stock %d (%v), want 50: the fixture's", p.Stock, err)
			}
			assertNoDrift(t, s)
		})
	}
}
