package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/order"
	"github.com/lockbench/shop/internal/storage"
)

// streamCheckTimeout bounds the stream's creation at start: a broker that
// does not answer within it is taken as down, not as misconfigured.
const streamCheckTimeout = 5 * time.Second

// openEvents connects to the broker (SHOP_NATS_URL, or an embedded
// nats-server), creates or updates the stream, and returns what the
// delivery of the events needs (deliverEvents). A broker that refuses the
// stream stops the start; one that does not answer does not: orders are
// taken and their events wait in the outbox, and /readyz and
// shop_events_broker_connected say so.
func (a *app) openEvents(ctx context.Context, cfg config.Config, db *storage.DB, l locking,
	reg prometheus.Registerer, log *slog.Logger) (events.RelayOptions, error) {
	url, err := a.natsURL(cfg, log)
	if err != nil {
		return events.RelayOptions{}, err
	}
	nc, err := nats.Connect(url, natsOptions(cfg, log)...)
	if err != nil {
		return events.RelayOptions{}, fmt.Errorf("events: connect to %s: %w", redactNATS(url), err)
	}
	a.closers = append(a.closers, func() error { nc.Close(); return nil })
	a.degraded = append(a.degraded, readyCheck{"nats broker", func(context.Context) error {
		if !nc.IsConnected() {
			return fmt.Errorf("not connected (%s); events wait in the outbox", nc.Status())
		}
		return nil
	}})
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(events.DefaultPublishTimeout))
	if err != nil {
		return events.RelayOptions{}, fmt.Errorf("events: %w", err)
	}
	a.broker = js
	e := cfg.Events
	stream := events.StreamOptions{Replicas: e.Replicas, DuplicateWindow: e.DuplicateWindow, MaxAge: e.MaxAge}
	sctx, cancel := context.WithTimeout(ctx, streamCheckTimeout)
	defer cancel()
	if err := events.EnsureStream(sctx, js, stream); err != nil {
		if events.BrokerRefused(err) {
			return events.RelayOptions{}, fmt.Errorf("events: the broker at %s refused the stream (check SHOP_EVENTS_REPLICAS and the account's JetStream limits): %w",
				redactNATS(url), err)
		}
		log.Warn("events: broker not answering at start; orders are taken and their events wait in the outbox",
			"nats_url", redactNATS(url), "err", err)
	}
	outbox := events.NewOutbox(db.DB)
	o := events.RelayOptions{Outbox: outbox, JS: js, Locker: l.Locker, LeaderTTL: cfg.LockTTL,
		Interval: e.RelayInterval, Batch: e.RelayBatch, MaxBackoff: e.RelayMaxBackoff, Stream: stream,
		Metrics: events.NewMetrics(reg, outbox, nc.IsConnected), Log: log}
	return o, nil
}

// deliverEvents delivers the events of the orders' commits as cfg says:
// the relay, woken by each commit, for outbox; a publish after each commit
// for direct.
func (a *app) deliverEvents(cfg config.Config, o events.RelayOptions, orders *order.Store) {
	if cfg.Events.Delivery == config.DeliveryDirect {
		orders.OnCommit(events.NewDirect(o).Publish)
		return
	}
	relay := events.NewRelay(o)
	orders.OnCommit(func(context.Context, ...string) { relay.Wake() })
	rctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { relay.Run(rctx) })
	a.closers = append(a.closers, func() error { stop(); wg.Wait(); return nil })
}

// natsURL is SHOP_NATS_URL, or the URL of an embedded nats-server started
// with its store beside the SQLite file (a temporary directory without
// one), so that make run needs nothing but Go.
func (a *app) natsURL(cfg config.Config, log *slog.Logger) (string, error) {
	if !cfg.Events.EmbeddedNATS() {
		return cfg.Events.NATSURL, nil
	}
	var dir string
	if cfg.SQLitePath != "" {
		dir = filepath.Join(filepath.Dir(cfg.SQLitePath), "nats")
	} else {
		tmp, err := os.MkdirTemp("", "shop-nats-")
		if err != nil {
			return "", fmt.Errorf("embedded nats-server: %w", err)
		}
		a.closers = append(a.closers, func() error { return os.RemoveAll(tmp) })
		dir = tmp
	}
	srv, err := events.StartEmbedded(dir)
	if err != nil {
		return "", err
	}
	a.closers = append(a.closers, func() error { srv.Close(); return nil })
	log.Info("embedded nats-server started (JetStream, file store)", "url", srv.URL(), "store", dir)
	return srv.URL(), nil
}

// natsOptions keep the connection trying for ever: a broker down at start
// or later is waited for, never a reason to stop taking orders.
func natsOptions(cfg config.Config, log *slog.Logger) []nats.Option {
	opts := []nats.Option{
		nats.Name("shop"),
		nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		// A server that stops answering (paused, or cut off while its
		// socket stays open) is left after 2 missed pings, 10-15 s, not
		// the client's default of 2 minutes x 2 while events wait.
		nats.PingInterval(5 * time.Second),
		nats.MaxPingsOutstanding(2),
		// No buffer while disconnected: a publish then fails at once and
		// the relay retries it later, rather than each retry queueing one
		// more copy for the reconnect to flush (and direct delivery
		// pretending to a publish that may or may not happen).
		nats.ReconnectBufSize(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("events: disconnected from the broker", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("events: reconnected to the broker", "url", redactNATS(nc.ConnectedUrlRedacted()))
		}),
	}
	if cfg.Events.NATSCreds != "" {
		opts = append(opts, nats.UserCredentials(cfg.Events.NATSCreds))
	}
	return opts
}

// redactNATS hides passwords in NATS URLs for logs and errors.
func redactNATS(urls string) string {
	parts := strings.Split(urls, ",")
	for i, u := range parts {
		if at := strings.LastIndex(u, "@"); at >= 0 {
			if scheme := strings.Index(u, "://"); scheme >= 0 && scheme < at {
				parts[i] = u[:scheme+3] + "***" + u[at:]
			}
		}
	}
	return strings.Join(parts, ",")
}
