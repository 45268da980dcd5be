package inventory

import (
	"context"
	"errors"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
	"github.com/lockbench/shop/internal/testenv"
)

// TestAMirrorLoadCannotOverwriteANewerStock: a buyer finds no mirror and
// reads the stock from the database; before it writes the mirror, an
// admin restock commits and drops the mirror. The buyer's load must not
// put the old stock back: every later buyer would be told what the
// database no longer says.
func TestAMirrorLoadCannotOverwriteANewerStock(t *testing.T) {
	ctx := context.Background()
	db := open(t, storage.Options{SQLitePath: t.TempDir() + "/inv.db"})
	m := mirror(t)
	store := NewStore(db.DB, m)
	if _, err := store.Put(ctx, Product{SKU: "m", Name: "m", Stock: 1, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	restocked := false
	m.afterRead = func(ctx context.Context) {
		if !restocked {
			restocked = true
			if _, err := store.Put(ctx, Product{SKU: "m", Name: "m", Stock: 100, PriceCents: 1}); err != nil {
				t.Error(err)
			}
		}
	}
	// The load read before the restock is refused; the sale loads again,
	// from a read after it, and takes its unit from the restocked mirror.
	if _, err := m.Take(ctx, "m", 1, store.Get); err != nil {
		t.Fatalf("the sale whose first load read before the restock: %v", err)
	}
	m.afterRead = nil
	for i := range 99 {
		if _, err := m.Take(ctx, "m", 1, store.Get); err != nil {
			t.Fatalf("take %d of the 100 restocked: %v", i+2, err)
		}
	}
}

// TestAMirrorSoldOutWhileTheDatabaseHoldsStockIsCorrected: a mirror that
// says sold out while the database holds stock (loaded stale, or short by
// units a lost commit never took) is checked against the database and
// reloaded, instead of refusing every buyer until the next change.
func TestAMirrorSoldOutWhileTheDatabaseHoldsStockIsCorrected(t *testing.T) {
	ctx := context.Background()
	db := open(t, storage.Options{SQLitePath: t.TempDir() + "/inv.db"})
	m := mirror(t)
	store := NewStore(db.DB, m)
	if _, err := store.Put(ctx, Product{SKU: "s", Name: "s", Stock: 5, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	if err := m.client.Set(ctx, m.key("s"), 0, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Take(ctx, "s", 1, store.Get); err != nil {
		t.Fatalf("take with 5 units in the database and a mirror at 0: %v", err)
	}
	// Reloaded with 5 and 1 taken; the sale's SQL write is not made here.
	if drift, err := store.MirrorDrift(ctx); err != nil || drift["s"] != -1 {
		t.Fatalf("mirror drift %v (%v), want s: -1, the unit taken since the reload", drift, err)
	}
	if err := m.client.Set(ctx, m.key("s"), 2, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if drift, err := store.MirrorDrift(ctx); err != nil || drift["s"] != 2-5 {
		t.Fatalf("mirror drift %v (%v), want s: -3", drift, err)
	}
}

// TestASaleWhoseLoadWasRefusedLeavesNoDrift: a buyer's load reads the
// database before a change drops the mirror; meanwhile another buyer
// loads the mirror afresh and buys from it. The first buyer's load is
// refused, and its sale must still end counted in the mirror or drop it:
// at rest the mirror says what the database holds.
func TestASaleWhoseLoadWasRefusedLeavesNoDrift(t *testing.T) {
	ctx := context.Background()
	store, m := stockedMirror(t, "r")
	svc, err := NewService(store, Options{Strategy: StrategyAtomicRedis, Mirror: m})
	if err != nil {
		t.Fatal(err)
	}
	first := true
	m.afterRead = func(ctx context.Context) {
		if !first {
			return
		}
		first = false
		m.Forget(ctx, "r") // a change of the product committed
		if _, err := svc.Purchase(ctx, 2, "r", 1); err != nil {
			t.Error(err)
		}
	}
	if _, err := svc.Purchase(ctx, 1, "r", 1); err != nil {
		t.Fatal(err)
	}
	if p, err := store.Get(ctx, "r"); err != nil || p.Stock != 8 {
		t.Fatalf("stock %d (%v), want 8", p.Stock, err)
	}
	if drift, err := store.MirrorDrift(ctx); err != nil || len(drift) != 0 {
		t.Fatalf("mirror drift %v (%v) at rest, want none", drift, err)
	}
}

// TestASaleThatBypassedTheMirrorDropsIt: changes refuse every load of a
// buyer's sale, so it takes nothing from the mirror and the database alone
// sells it; another buyer loaded the mirror before that sale committed.
// The sale changed the stock past the mirror, so it drops it, as every such
// change does: at rest the mirror says what the database holds.
func TestASaleThatBypassedTheMirrorDropsIt(t *testing.T) {
	ctx := context.Background()
	store, m := stockedMirror(t, "b")
	svc, err := NewService(store, Options{Strategy: StrategyAtomicRedis, Mirror: m})
	if err != nil {
		t.Fatal(err)
	}
	reads := 0
	m.afterRead = func(ctx context.Context) {
		reads++
		if reads > 3 {
			return // the other buyer's load
		}
		m.Forget(ctx, "b") // a change of the product committed
		if reads == 3 {
			if _, err := svc.Purchase(ctx, 2, "b", 1); err != nil {
				t.Error(err)
			}
		}
	}
	if _, err := svc.Purchase(ctx, 1, "b", 1); err != nil {
		t.Fatal(err)
	}
	if p, err := store.Get(ctx, "b"); err != nil || p.Stock != 8 {
		t.Fatalf("stock %d (%v), want 8", p.Stock, err)
	}
	if drift, err := store.MirrorDrift(ctx); err != nil || len(drift) != 0 {
		t.Fatalf("mirror drift %v (%v) at rest, want none", drift, err)
	}
}

// TestAGiveBackCannotAddToAReloadedMirror: a buyer takes a unit, then a
// change drops the mirror and another buyer reloads it from the database,
// which never had the first buyer's sale. The database then refuses that
// sale (a limit): its unit must not go back into the new mirror, which
// never counted it, or the mirror holds a unit the database has not.
func TestAGiveBackCannotAddToAReloadedMirror(t *testing.T) {
	ctx := context.Background()
	store, m := stockedMirror(t, "g")
	first, err := m.Take(ctx, "g", 1, store.Get)
	if err != nil {
		t.Fatal(err)
	}
	m.Forget(ctx, "g") // a change of the product committed
	if _, err := m.Take(ctx, "g", 1, store.Get); err != nil {
		t.Fatal(err)
	}
	m.GiveBack(ctx, "g", 1, first)
	if left, err := m.client.Get(ctx, m.key("g")).Int64(); err != nil || left != 9 {
		t.Fatalf("mirror %d (%v), want 9: the reload's 10 less the second buyer's unit", left, err)
	}
}

// stockedMirror is a store on MariaDB whose stock mirror is on the real
// Redis, holding 10 units of sku.
func stockedMirror(t *testing.T, sku string) (*Store, *Mirror) {
	t.Helper()
	db := open(t, storage.Options{MySQLDSN: shoptest.MySQL(t)})
	c := redis.NewClient(&redis.Options{Addr: shoptest.Env(t, "SHOP_TEST_REDIS_ADDR")})
	t.Cleanup(func() { c.Close() })
	m := NewMirror(c, shoptest.Prefix("mirror"))
	store := NewStore(db.DB, m)
	if _, err := store.Put(context.Background(), Product{SKU: sku, Name: sku, Stock: 10, PriceCents: 1}); err != nil {
		t.Fatal(err)
	}
	return store, m
}

// cutMirror is a mirror of sku holding stock on the real Redis, and the
// same mirror seen through a proxy that loses the reply of the first
// command naming sku's mirror.
func cutMirror(t *testing.T, sku string, stock int64) (direct, cut *Mirror, cutter *testenv.ReplyCutter) {
	t.Helper()
	addr := shoptest.Env(t, "SHOP_TEST_REDIS_ADDR")
	ctx := context.Background()
	dc := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { dc.Close() })
	prefix := shoptest.Prefix("inventory")
	direct = NewMirror(dc, prefix)
	t.Cleanup(func() { dc.Del(context.Background(), direct.keys(sku)...) })
	if err := dc.Set(ctx, direct.key(sku), stock, 0).Err(); err != nil {
		t.Fatal(err)
	}
	// Loaded beforehand, so that the lost reply is the script's, not a
	// NOSCRIPT that go-redis answers with EVAL.
	for _, sc := range []*redis.Script{takeScript, giveBackScript} {
		if err := sc.Load(ctx, dc).Err(); err != nil {
			t.Fatal(err)
		}
	}
	cutter, via := testenv.NewReplyCutter(t, addr, []byte(direct.key(sku)))
	pc := redis.NewClient(&redis.Options{Addr: via, ContextTimeoutEnabled: true})
	t.Cleanup(func() { pc.Close() })
	return direct, NewMirror(pc, prefix), cutter
}

func mirrorStock(t *testing.T, m *Mirror, sku string) int64 {
	t.Helper()
	n, err := m.client.Get(context.Background(), m.key(sku)).Int64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestATakeWhoseReplyIsLostTakesOnce: the mirror's decrement runs, then
// the connection drops before its reply (a failover, a cut link); the
// client sends it again. One sale of one unit must take one unit.
func TestATakeWhoseReplyIsLostTakesOnce(t *testing.T) {
	direct, cut, cutter := cutMirror(t, "cut", 10)
	noLoad := func(context.Context, string) (Product, error) {
		t.Error("the mirror was loaded: it holds the stock")
		return Product{}, errors.New("no load")
	}
	if _, err := cut.Take(context.Background(), "cut", 1, noLoad); err != nil {
		t.Logf("take with its reply lost: %v (an unknown outcome)", err)
	}
	if !cutter.Cut() {
		t.Fatal("no reply was lost: the test proves nothing")
	}
	if n := mirrorStock(t, direct, "cut"); n != 9 {
		t.Errorf("mirror holds %d, want 9: one unit taken", n)
	}
}

// TestAGiveBackWhoseReplyIsLostGivesOnce: the same for the units given
// back after the database refused a sale.
func TestAGiveBackWhoseReplyIsLostGivesOnce(t *testing.T) {
	direct, cut, cutter := cutMirror(t, "cut", 9)
	cut.GiveBack(context.Background(), "cut", 1, 0)
	if !cutter.Cut() {
		t.Fatal("no reply was lost: the test proves nothing")
	}
	if n := mirrorStock(t, direct, "cut"); n != 10 {
		t.Errorf("mirror holds %d, want 10: one unit given back", n)
	}
}
