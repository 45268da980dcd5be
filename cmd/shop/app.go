package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/gin-gonic/gin"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/idem"
	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/like"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/instrument"
	"github.com/lockbench/shop/internal/loyalty"
	"github.com/lockbench/shop/internal/optimistic"
	"github.com/lockbench/shop/internal/order"
	"github.com/lockbench/shop/internal/storage"
)

// domain is what a business package gives the wiring. Adding one (likes,
// orders) is a constructor like newLikes, one line in newDomains' list,
// and its Problems in problems().
type domain interface {
	// Register adds routes: api authenticates users, admin the operator.
	Register(api, admin *gin.RouterGroup)
	audit.Resetter
	Checks() []audit.Check
	// A domain that keeps fences must be able to forget them; required
	// of every domain, so that a new one cannot leave it out unnoticed.
	guard.FencedDomain
}

// models are every table, for migrations. Add a domain's here.
func models() []any {
	return slices.Concat(account.Models(), inventory.Models(), order.Models(), idem.Models(),
		loyalty.Models(), events.ConsumerModels())
}

// app is one shop process's wiring: open it, serve its handler, close it.
type app struct {
	handler http.Handler
	// metrics serves /metrics, on a listener of its own unless
	// SHOP_METRICS_ADDR names the API's address.
	metrics http.Handler
	// ready are the dependency checks of /readyz.
	ready []readyCheck
	// degraded are dependencies /readyz names without failing: without
	// them the instance still serves (the broker: events wait).
	degraded []readyCheck
	stopping atomic.Bool
	closers  []func() error // run in reverse order
	// records are the idempotency records: reset with the domains, pruned
	// by one instance at a time.
	records *idem.Idem
	// broker is the connection openEvents made, which the consumer in
	// serve shares.
	broker jetstream.JetStream
	// lockRedis is the Redis of SHOP_LOCK_REDIS_ADDRS, nil when the locks
	// share the main Redis.
	lockRedis redis.UniversalClient
	// hooks for tests in this package
	accounts *account.Store
}

type readyCheck struct {
	name string
	ping func(context.Context) error
}

// openApp wires a new app, and closes what wire opened if it fails.
func openApp(wire func(*app) error) (*app, error) {
	a := &app{}
	if err := wire(a); err != nil {
		_ = a.close()
		return nil, err
	}
	return a, nil
}

// newApp opens the stores, the lock backend and the domains of cfg, and
// starts the order closer. On error it closes what it opened.
func newApp(ctx context.Context, cfg config.Config, log *slog.Logger) (*app, error) {
	return openApp(func(a *app) error { return a.wireServe(ctx, cfg, log) })
}

func (a *app) wireServe(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	db, rdb, err := a.openStores(ctx, cfg, log)
	if err != nil {
		return err
	}
	reg := newRegistry()
	locks, err := a.openLocking(ctx, cfg, db, rdb, reg)
	if err != nil {
		return err
	}
	domains, orders, err := a.newDomains(ctx, cfg, db, rdb, locks)
	if err != nil {
		return err
	}
	for _, d := range domains {
		if c, ok := d.(interface{ Collectors() []prometheus.Collector }); ok {
			reg.MustRegister(c.Collectors()...)
		}
	}
	delivery, err := a.openEvents(ctx, cfg, db, locks, reg, log)
	if err != nil {
		return err
	}
	a.deliverEvents(cfg, delivery, orders.Store)
	a.startCloser(orders.Service, log)
	a.startPruner(locks.Locker, cfg.LockTTL, log)
	a.records.RegisterMetrics(reg)
	if err := a.consumeInServe(cfg, db, locks, reg, log); err != nil {
		return err
	}
	a.newHandlers(cfg, log, domains, reg, db)
	return nil
}

// consumeInServe runs the loyalty consumer inside shop serve, as make run
// needs, unless SHOP_EVENTS_CONSUME_IN_SERVE=false leaves it to shop
// consume processes.
// It shares the relay's broker connection (the embedded nats-server for
// make run).
func (a *app) consumeInServe(cfg config.Config, db *storage.DB, locks locking, reg prometheus.Registerer, log *slog.Logger) error {
	if !cfg.Events.ConsumeInServe {
		return nil
	}
	consumer, err := newLoyaltyConsumer(cfg, db, locks, reg, log)
	if err != nil {
		return err
	}
	a.startConsumer(consumer, a.broker, log)
	return nil
}

// newDomains builds every domain on the stores and the locking, and
// returns them with the order domain, whose closer and events the app
// runs.
func (a *app) newDomains(ctx context.Context, cfg config.Config, db *storage.DB, rdb redis.UniversalClient,
	locks locking) ([]domain, *order.Domain, error) {
	// Idempotency leases and answers live in Redis whatever the lock
	// backend, each fenced by its own run number, not by a lock; the
	// record of a keyed change commits with the change, in the database.
	tokens, err := idem.New(rdb, idem.Options{TTL: cfg.IdemTTL, MaxTokens: cfg.IdemMaxTokens, Prefix: cfg.KeyPrefix, DB: db.DB})
	if err != nil {
		return nil, nil, err
	}
	a.records = tokens
	accounts := newAccounts(cfg, db, locks, tokens)
	a.accounts = accounts.Store
	products, err := newProducts(cfg, db, rdb, locks, tokens)
	if err != nil {
		return nil, nil, err
	}
	likes, err := newLikes(cfg, rdb, locks)
	if err != nil {
		return nil, nil, err
	}
	orders := newOrders(cfg, db, locks, tokens, accounts.Store, products.Store)
	points := &loyalty.Domain{Store: loyalty.NewStore(db.DB), Consumer: events.NewConsumerStore(db.DB)}
	domains := []domain{accounts, products, likes, orders, points}
	if err := forgetFences(ctx, cfg, domains); err != nil {
		return nil, nil, err
	}
	return domains, orders, nil
}

// newHandlers builds the handlers: the API and admin routes of domains, the
// probes, and /metrics from reg.
func (a *app) newHandlers(cfg config.Config, log *slog.Logger, domains []domain, reg *prometheus.Registry, db *storage.DB) {
	a.metrics = a.metricsHandler(reg)
	a.handler = newRouter(routerDeps{
		cfg:      cfg,
		log:      log,
		auth:     auth.New([]byte(cfg.JWTSecret), cfg.AdminToken, auth.MaxLifetime(cfg.JWTMaxTTL)),
		auditor:  newAuditor(cfg, domains, reg, a.records, db),
		domains:  domains,
		problems: problems(),
		reg:      reg,
		metrics:  a.metrics,
		ready:    a.readiness,
		degraded: a.degradation,
	})
}

// openStores opens the database, migrated, Redis, and the lock Redis.
func (a *app) openStores(ctx context.Context, cfg config.Config, log *slog.Logger) (*storage.DB, redis.UniversalClient, error) {
	db, err := storage.Open(ctx, storage.Options{MySQLDSN: cfg.MySQLDSN, SQLitePath: cfg.SQLitePath, MaxConns: cfg.DBMaxConns,
		SlowQuery: cfg.SlowQuery, Log: log})
	if err != nil {
		return nil, nil, err
	}
	a.closers = append(a.closers, db.Close)
	a.ready = append(a.ready, readyCheck{"database", db.Ping})
	if err := db.DB.Use(sqlTracing{system: dbSystem(cfg)}); err != nil {
		return nil, nil, fmt.Errorf("sql tracing: %w", err)
	}
	if err := migrateAll(ctx, db); err != nil {
		return nil, nil, fmt.Errorf("migrate: %w", err)
	}

	// Redis is always opened: likes and idempotency tokens live there
	// whatever the lock backend.
	rdb, err := openRedis(cfg, a, log)
	if err != nil {
		return nil, nil, err
	}
	a.ready = append(a.ready, readyCheck{"redis", func(ctx context.Context) error { return rdb.Ping(ctx).Err() }})
	if err := a.openLockRedis(ctx, cfg, rdb, log); err != nil {
		return nil, nil, err
	}
	return db, rdb, nil
}

// migrateAll migrates the schema, then the rows an earlier version left in
// a form this one refuses: SKUs with upper case. A SKU that cannot take
// its lower-case form (another product has it) is left for the admin to
// rename or delete, with a warning: the rest of the shop can serve.
func migrateAll(ctx context.Context, db *storage.DB) error {
	if err := db.Migrate(ctx, models()...); err != nil {
		return err
	}
	err := order.LowerSKUs(ctx, db.DB)
	if errors.Is(err, inventory.ErrSKUCollision) {
		slog.WarnContext(ctx, "products left unreachable: their SKUs have upper case, and another product has the lower-case form", "err", err)
		return nil
	}
	return err
}

// locking is what every domain's service is given to keep its writes
// right, built once by openLocking: the lock backend as the domains take
// it, and the optimistic retry policy, each with its metrics.
type locking struct {
	guard.Locking
	retry optimistic.Retry
}

// openLocking opens the lock backend cfg names and wraps it as every
// domain uses it.
func (a *app) openLocking(ctx context.Context, cfg config.Config, db *storage.DB, rdb redis.UniversalClient,
	reg prometheus.Registerer) (locking, error) {
	backend, err := openLocker(ctx, cfg, deps{redis: rdb, lockRedis: a.lockRedis, db: db})
	if err != nil {
		return locking{}, err
	}
	a.closers = append(a.closers, backend.Close)
	if p, ok := backend.(interface{ Ping(context.Context) error }); ok {
		a.ready = append(a.ready, readyCheck{"lock backend " + cfg.LockBackend, p.Ping})
	}

	lockMetrics := instrument.NewMetrics(reg, cfg.LockBackend)
	l := locking{
		Locking: guard.Locking{
			Locker: instrument.Wrap(backend, instrument.Options{Backend: cfg.LockBackend, Metrics: lockMetrics,
				MaxWaiters: cfg.LockMaxWaiters}),
			Metrics:              lockMetrics,
			CriticalSectionDelay: cfg.CriticalSectionDelay,
		},
		retry: optimistic.Retry{Policy: optimistic.DefaultPolicy, Metrics: optimistic.NewMetrics(reg)},
	}
	l.retry.Policy.Attempts = cfg.OptimisticAttempts
	if cfg.LockTTL > 0 {
		l.LockOptions = append(l.LockOptions, lockkit.WithTTL(cfg.LockTTL))
	}
	if cfg.LockWaitTimeout > 0 {
		l.LockOptions = append(l.LockOptions, lockkit.WithWaitTimeout(cfg.LockWaitTimeout))
	}
	return l, nil
}

func newAccounts(cfg config.Config, db *storage.DB, l locking, tokens *idem.Idem) *account.Domain {
	store := account.NewStore(db.DB)
	return &account.Domain{Store: store, Service: account.NewService(store, account.Options{
		Locking: l.Locking, Retry: l.retry, Strategy: cfg.BalanceStrategy,
	}), Idempotent: tokens.Optional()}
}

func newProducts(cfg config.Config, db *storage.DB, rdb redis.UniversalClient, l locking, tokens *idem.Idem) (*inventory.Domain, error) {
	var mirror *inventory.Mirror
	if cfg.StockStrategy == config.StockAtomicRedis {
		mirror = inventory.NewMirror(rdb, cfg.KeyPrefix)
	}
	store := inventory.NewStore(db.DB, mirror)
	products, err := inventory.NewService(store, inventory.Options{
		Locking: l.Locking, Retry: l.retry, Strategy: cfg.StockStrategy, Mirror: mirror, Combine: cfg.StockCombine,
	})
	if err != nil {
		return nil, err
	}
	return &inventory.Domain{Service: products, Store: store, Idempotent: tokens.Optional()}, nil
}

func newLikes(cfg config.Config, rdb redis.UniversalClient, l locking) (*like.Domain, error) {
	likes, err := like.New(rdb, like.Options{Locking: l.Locking, Strategy: cfg.LikeStrategy, Prefix: cfg.KeyPrefix})
	if err != nil {
		return nil, err
	}
	return &like.Domain{Service: likes}, nil
}

func newOrders(cfg config.Config, db *storage.DB, l locking, tokens *idem.Idem,
	accounts *account.Store, products *inventory.Store) *order.Domain {
	store := order.NewStore(db.DB, products, accounts)
	orders := order.NewService(store, order.Options{Locking: l.Locking,
		PayTimeout: cfg.OrderPayTimeout, LeaderTTL: cfg.LockTTL, MaxUnpaidUnits: cfg.OrderMaxUnpaidUnits})
	return &order.Domain{Service: orders, Store: store, Idem: tokens}
}

// forgetFences: the embedded Redis starts empty, fence counters included;
// only the clock floor keeps its tokens above the fences an earlier run
// left in a kept SQLite file, and a clock stepped back would have them
// refuse every write. No other process can hold a lock on an in-process
// server, so forgetting them is safe; it is not when the locks live on a
// lock Redis of their own.
func forgetFences(ctx context.Context, cfg config.Config, domains []domain) error {
	if !cfg.LocksOnEmbeddedRedis() {
		return nil
	}
	for _, d := range domains {
		if err := d.ForgetFences(ctx); err != nil {
			return fmt.Errorf("forget fences: %w", err)
		}
	}
	return nil
}

// newAuditor audits every domain's checks and resets every domain, in the
// order of domains, then the idempotency records of their changes, all in
// one database transaction.
func newAuditor(cfg config.Config, domains []domain, reg prometheus.Registerer, records *idem.Idem, db *storage.DB) *audit.Auditor {
	var checks []audit.Check
	var resetters []audit.Resetter
	for _, d := range domains {
		checks = append(checks, d.Checks()...)
		resetters = append(resetters, d)
	}
	resetters = append(resetters, records)
	auditor := audit.New(checks, resetters)
	auditor.ResetAtomically(func(ctx context.Context, fn func(context.Context) error) error {
		return db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return fn(storage.InTx(ctx, tx)) })
	})
	auditor.RegisterMetrics(reg)
	if !cfg.AllowReset {
		auditor.DisableReset()
	}
	return auditor
}

// newRegistry holds every metric of the process, the Go runtime's and the
// process's own included.
func newRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// metricsHandler serves reg, with shop_ready added.
func (a *app) metricsHandler(reg *prometheus.Registry) http.Handler {
	// Asked at each scrape, so that an alert sees what /readyz would say
	// without anyone probing it (deploy/prometheus/alerts.yml).
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "shop_ready",
		Help: "1 when /readyz would answer 200: every dependency answered within the budget and the instance is not shutting down.",
	}, func() float64 {
		if len(a.readiness(context.Background())) > 0 {
			return 0
		}
		return 1
	}))
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg})
}

// startCloser runs the order closer until the app closes. It stops before
// the stores and the locker close (closers run last opened first), so that
// no round runs on a closed database.
func (a *app) startCloser(orders *order.Service, log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		orders.RunCloser(ctx, log)
	}()
	a.closers = append(a.closers, func() error { cancel(); <-done; return nil })
}

// startPruner prunes expired idempotency records until the app closes,
// under a leader lease from leader; like the closer, it stops before the
// stores close.
func (a *app) startPruner(leader lockkit.Locker, leaderTTL time.Duration, log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.records.RunPruner(ctx, leader, leaderTTL, log)
	}()
	a.closers = append(a.closers, func() error { cancel(); <-done; return nil })
}

// openRedis connects to SHOP_REDIS_ADDRS, or starts the embedded server.
func openRedis(cfg config.Config, a *app, log *slog.Logger) (redis.UniversalClient, error) {
	// ContextTimeoutEnabled: without it go-redis bounds a call by its read
	// timeout and retries (seconds) instead of the caller's context, so a
	// lock wait or request deadline means nothing while Redis is unreachable.
	opts := &redis.UniversalOptions{Addrs: cfg.RedisAddrs, MasterName: cfg.RedisSentinelMaster, ContextTimeoutEnabled: true}
	if cfg.EmbeddedRedis() {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("embedded redis: %w", err)
		}
		a.closers = append(a.closers, func() error { m.Close(); return nil })
		log.Info("embedded Redis-protocol server started (in-process, data lost at exit)", "addr", m.Addr())
		opts.Addrs = []string{m.Addr()}
	}
	return a.dialRedis(opts)
}

// readinessBudget bounds a whole /readyz answer: under the 2 s of the
// probes (shop healthcheck, compose), so that a slow dependency is named in
// the answer rather than the probe timing out without a reason.
const readinessBudget = 1500 * time.Millisecond

// errReadyTimeout marks a dependency that did not answer within the budget.
var errReadyTimeout = fmt.Errorf("no answer within %s", readinessBudget)

// readiness pings every dependency at once, all within readinessBudget; a
// ping still running at the deadline is reported as errReadyTimeout.
func (a *app) readiness(ctx context.Context) (down map[string]error) {
	if a.stopping.Load() {
		return map[string]error{"shutdown": errors.New("this instance is shutting down")}
	}
	ctx, cancel := context.WithTimeout(ctx, readinessBudget)
	defer cancel()
	type result struct {
		name string
		err  error
	}
	results := make(chan result, len(a.ready)) // buffered: a late ping never blocks
	for _, c := range a.ready {
		go func() { results <- result{c.name, c.ping(ctx)} }()
	}
	down = map[string]error{}
	waiting := map[string]bool{}
	for _, c := range a.ready {
		waiting[c.name] = true
	}
	for len(waiting) > 0 {
		select {
		case r := <-results:
			delete(waiting, r.name)
			if errors.Is(r.err, context.DeadlineExceeded) {
				r.err = errReadyTimeout
			}
			if r.err != nil {
				down[r.name] = r.err
			}
		case <-ctx.Done():
			for name := range waiting {
				down[name] = errReadyTimeout
			}
			return down
		}
	}
	return down
}

// degradation asks the degraded checks, within readinessBudget: what
// /readyz names while still answering 200.
func (a *app) degradation(ctx context.Context) map[string]error {
	ctx, cancel := context.WithTimeout(ctx, readinessBudget)
	defer cancel()
	out := map[string]error{}
	for _, c := range a.degraded {
		if err := c.ping(ctx); err != nil {
			out[c.name] = err
		}
	}
	return out
}

// close releases everything newApp opened, last opened first.
func (a *app) close() error {
	var errs []error
	for i := len(a.closers) - 1; i >= 0; i-- {
		errs = append(errs, a.closers[i]())
	}
	a.closers = nil
	return errors.Join(errs...)
}
