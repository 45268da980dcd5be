package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/gin-gonic/gin"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/loyalty"
	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/storage"
)

// newLoyaltyConsumer is the loyalty-points consumer with cfg's dedup, on
// the app's database and locking.
func newLoyaltyConsumer(cfg config.Config, db *storage.DB, locks locking, reg prometheus.Registerer,
	log *slog.Logger) (*events.Consumer, error) {
	dedup, err := events.NewDedup(events.DedupOptions{Mode: cfg.Events.Dedup, DB: db.DB,
		Locker: locks.Locker, LockOptions: locks.LockOptions})
	if err != nil {
		return nil, err
	}
	return events.NewConsumer(events.ConsumerOptions{
		Name: loyalty.ConsumerName, AckWait: cfg.Events.AckWait, MaxDeliver: cfg.Events.MaxDeliver,
		Dedup: dedup, Store: events.NewConsumerStore(db.DB), Effect: loyalty.Effect{},
		Metrics: events.NewConsumerMetrics(reg), Log: log.With("component", "consumer"),
	})
}

// connectJetStream connects shop consume to SHOP_NATS_URL, reconnecting
// for ever: a broker that is down at start or later delays the credits, it
// does not stop the process. /readyz fails while it is away: a consumer
// without its broker has nothing to do.
func (a *app) connectJetStream(cfg config.Config, log *slog.Logger) (jetstream.JetStream, error) {
	nc, err := nats.Connect(cfg.Events.NATSURL, natsOptions(cfg, log)...)
	if err != nil {
		return nil, fmt.Errorf("events: connect to %s: %w", redactNATS(cfg.Events.NATSURL), err)
	}
	a.closers = append(a.closers, func() error { nc.Close(); return nil })
	a.ready = append(a.ready, readyCheck{"nats", func(context.Context) error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected (%s)", nc.Status())
		}
		return nil
	}})
	return jetstream.New(nc)
}

// startConsumer runs c on js until the app closes; it stops before the
// stores close (closers run last opened first).
func (a *app) startConsumer(c *events.Consumer, js jetstream.JetStream, log *slog.Logger) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx, js); err != nil {
			log.Error("consumer stopped", "err", err)
		}
	}()
	a.closers = append(a.closers, func() error { cancel(); <-done; return nil })
}

// newConsumeApp is shop consume's wiring: the database, the lock backend
// (for the lock dedup), the consumer, and an HTTP handler with only the
// probes and /metrics. It serves no API and runs no closer or relay.
func newConsumeApp(ctx context.Context, cfg config.Config, log *slog.Logger) (*app, error) {
	return openApp(func(a *app) error { return a.wireConsume(ctx, cfg, log) })
}

func (a *app) wireConsume(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	db, rdb, err := a.openStores(ctx, cfg, log)
	if err != nil {
		return err
	}
	reg := newRegistry()
	locks, err := a.openLocking(ctx, cfg, db, rdb, reg)
	if err != nil {
		return err
	}
	consumer, err := newLoyaltyConsumer(cfg, db, locks, reg, log)
	if err != nil {
		return err
	}
	js, err := a.connectJetStream(cfg, log)
	if err != nil {
		return err
	}
	a.startConsumer(consumer, js, log)
	a.metrics = a.metricsHandler(reg)
	a.handler = probesOnly(cfg, a)
	return nil
}

// probesOnly serves /healthz, /readyz and (unless SHOP_METRICS_ADDR moves
// it) /metrics; everything else is a problem+json 404.
func probesOnly(cfg config.Config, a *app) http.Handler {
	r := gin.New()
	r.Use(problem.Errors(nil), problem.Recover())
	r.NoRoute(problem.NoRoute)
	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	r.GET("/readyz", readyz(a.readiness, a.degradation))
	if cfg.MetricsOnHTTPAddr() {
		r.GET("/metrics", gin.WrapH(a.metrics))
	}
	return r
}
