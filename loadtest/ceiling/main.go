// Command ceiling times the serialized part of one hot-SKU purchase on the
// servers the SHOP_* variables name (the capacity run's ceiling):
//
//	ceiling [-n 300] [-sku lt-ceiling]
//
// One client buys -n units of -sku (created or reset first), one at a time,
// through the configured strategy and lock backend, and prints as JSON the
// median time other buyers of the same SKU must wait for each sale, and its
// inverse, the ceiling of that SKU's rate: no number of buyers can beat it.
// make capacity (loadtest/runner) prints it beside the rate it measured.
// It is load-test tooling, not part of the service: bin/shop does not carry it.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/registry"
	"github.com/lockbench/shop/internal/order"
	"github.com/lockbench/shop/internal/storage"
)

// report is what ceiling prints: how long the serialized part of one
// purchase takes on these servers, and the rate that allows.
type report struct {
	Strategy string `json:"strategy"`
	Backend  string `json:"backend"`
	Sales    int    `json:"sales"`
	// Window is what every buyer of one hot SKU waits for in turn: for a
	// lock, the grant + the statements inside + the release; for the
	// lock-free strategies, the whole purchase (its row-lock window is a
	// part of it, so their ceiling is conservative).
	Window           string  `json:"window"`
	SerializedMicros float64 `json:"serialized_us_median"`
	CeilingPerSec    float64 `json:"ceiling_per_sec"`
}

func main() {
	n := flag.Int("n", 300, "sales to time")
	sku := flag.String("sku", "lt-ceiling", "SKU to create and sell")
	flag.Parse()
	if *n < 1 || !inventory.ValidSKU(*sku) || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: ceiling [-n 300] [-sku lt-ceiling]; -n at least 1, -sku a valid SKU")
		os.Exit(2)
	}
	cfg, err := config.Load(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ceiling: invalid configuration:\n%v\n", err)
		os.Exit(2)
	}
	rep, err := measureCeiling(context.Background(), cfg, *sku, *n)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ceiling: %v\n", err)
		os.Exit(1)
	}
	_ = json.NewEncoder(os.Stdout).Encode(rep)
}

func measureCeiling(ctx context.Context, cfg config.Config, sku string, n int) (report, error) {
	rep := report{Strategy: cfg.StockStrategy, Backend: cfg.LockBackend, Sales: n, Window: "purchase"}
	locked := cfg.StockStrategy == config.StockLock
	if locked {
		rep.Window = "acquire + critical section + release"
	}
	const warmup = 20
	svc, timed, closeAll, err := openSeller(ctx, cfg, sku, n+warmup)
	if err != nil {
		return rep, err
	}
	defer closeAll()
	windows := make([]time.Duration, 0, n)
	for i := range n + warmup {
		t0 := time.Now()
		if _, err := svc.Purchase(ctx, 1, sku, 1); err != nil {
			return rep, fmt.Errorf("sale %d: %w", i, err)
		}
		w := time.Since(t0)
		if locked {
			w = timed.last()
		}
		if i >= warmup {
			windows = append(windows, w)
		}
	}
	slices.Sort(windows)
	median := windows[len(windows)/2]
	rep.SerializedMicros = float64(median) / float64(time.Microsecond)
	rep.CeilingPerSec = float64(time.Second) / float64(median)
	return rep, nil
}

// openSeller opens the stores and the lock backend of cfg and puts sku on
// sale with stock units; one client sells it, so combining stays off.
func openSeller(ctx context.Context, cfg config.Config, sku string, stock int) (_ inventory.Service, _ *windowLocker, closeAll func(), err error) {
	if cfg.EmbeddedRedis() {
		return nil, nil, nil, fmt.Errorf("needs SHOP_REDIS_ADDRS: an embedded Redis would be a server of its own, not the one measured")
	}
	var closers []func() error
	closeAll = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			_ = closers[i]()
		}
	}
	defer func() {
		if err != nil {
			closeAll()
		}
	}()
	db, err := storage.Open(ctx, storage.Options{MySQLDSN: cfg.MySQLDSN, SQLitePath: cfg.SQLitePath, MaxConns: 4})
	if err != nil {
		return nil, nil, nil, err
	}
	closers = append(closers, db.Close)
	if err := db.Migrate(ctx, slices.Concat(account.Models(), inventory.Models(), order.Models())...); err != nil {
		return nil, nil, nil, err
	}
	rdb := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: cfg.RedisAddrs, MasterName: cfg.RedisSentinelMaster, ContextTimeoutEnabled: true})
	closers = append(closers, rdb.Close)
	backend, err := registry.Open(ctx, cfg.LockBackend, registry.Settings{
		KeyPrefix: cfg.KeyPrefix, Redis: rdb, DB: db.DB, RedlockAddrs: cfg.RedlockAddrs,
		ZKAddrs: cfg.ZKAddrs, EtcdEndpoints: cfg.EtcdEndpoints, MemcachedAddrs: cfg.MemcachedAddrs,
	})
	if err != nil {
		return nil, nil, nil, err
	}
	closers = append(closers, backend.Close)
	timed := &windowLocker{Locker: lockkit.Reentrant(backend)}
	var mirror *inventory.Mirror
	if cfg.StockStrategy == config.StockAtomicRedis {
		mirror = inventory.NewMirror(rdb, cfg.KeyPrefix)
	}
	store := inventory.NewStore(db.DB, mirror)
	svc, err := inventory.NewService(store, inventory.Options{Strategy: cfg.StockStrategy, Locking: guard.Locking{Locker: timed}, Mirror: mirror})
	if err != nil {
		return nil, nil, nil, err
	}
	if _, err := store.Put(ctx, inventory.Product{SKU: sku, Name: "ceiling probe", Stock: int64(stock), PriceCents: 1}); err != nil {
		return nil, nil, nil, err
	}
	return svc, timed, closeAll, nil
}

// windowLocker times each lease from the start of its Acquire to the end
// of its Release: the span during which the key is not free for anyone
// else, grant and hand-back included.
type windowLocker struct {
	lockkit.Locker
	mu     sync.Mutex
	window time.Duration
}

func (w *windowLocker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	t0 := time.Now()
	l, err := w.Locker.Acquire(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	return &windowLease{Lease: l, t0: t0, w: w}, nil
}

func (w *windowLocker) last() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.window
}

func (w *windowLocker) Capabilities() lockkit.Capabilities { return lockkit.CapabilitiesOf(w.Locker) }

type windowLease struct {
	lockkit.Lease
	t0 time.Time
	w  *windowLocker
}

func (l *windowLease) Release(ctx context.Context) error {
	err := l.Lease.Release(ctx)
	l.w.mu.Lock()
	l.w.window = time.Since(l.t0)
	l.w.mu.Unlock()
	return err
}
