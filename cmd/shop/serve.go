package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/lockbench/shop/internal/config"
)

// cancelGrace is how long cancelled handlers get to return. They stop at
// their next context check; one still running after this is stuck in I/O
// with no deadline, and waiting longer would not help.
const cancelGrace = 5 * time.Second

// serve runs until ctx ends (SIGTERM/SIGINT), then shuts down so that no
// store is ever closed under a running handler:
//
//  1. /readyz answers 503 while requests are still served, for
//     cfg.DrainDelay, so that a load balancer stops sending new ones;
//  2. the listener closes and in-flight requests get cfg.ShutdownTimeout
//     to finish (each releases its locks as its handler returns);
//  3. those still running then have their contexts cancelled, which rolls
//     back their transactions, and serve waits for them to return;
//  4. only then do the locker, Redis and the database close.
//
// If a handler ignores its cancellation, serve returns an error with the
// stores left open: the process exit ends their connections and the
// database rolls back what was not committed, where closing them would let
// the handler run on against closed clients.
func serve(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	return serveApp(ctx, cfg, log, newApp)
}

// serveApp is serve with the app open makes: newApp for shop serve,
// newConsumeApp for shop consume (probes and metrics only).
func serveApp(ctx context.Context, cfg config.Config, log *slog.Logger, open appOpener) error {
	log.Info("starting", "version", readBuildInfo().String(), "config", cfg)
	s, err := start(ctx, cfg, log, open)
	if err != nil {
		return err
	}
	select {
	case err := <-s.failed:
		// A listener failed: stop at once, but still never close a store
		// under a running handler.
		s.cancelRequests(errShuttingDown)
		s.closeListeners()
		return s.stop(err)
	case <-ctx.Done():
	}
	return s.stop(s.drain())
}

// server is one running shop: its app, its listeners and its requests.
type server struct {
	cfg            config.Config
	log            *slog.Logger
	app            *app
	http, metrics  *http.Server // metrics is nil when /metrics is on http
	failed         chan error   // a listener's Serve returned
	running        inflight
	cancelRequests context.CancelCauseFunc
}

// appOpener opens an app: newApp or newConsumeApp.
type appOpener func(ctx context.Context, cfg config.Config, log *slog.Logger) (*app, error)

// start opens the app and its listeners. On error nothing stays open.
func start(ctx context.Context, cfg config.Config, log *slog.Logger, open appOpener) (_ *server, err error) {
	a, err := open(ctx, cfg, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = a.close()
		}
	}()
	// Requests live on a context of their own: SIGTERM must not cancel
	// them, only an overrun shutdown timeout does.
	requests, cancel := context.WithCancelCause(context.Background())
	s := &server{cfg: cfg, log: log, app: a, failed: make(chan error, 2), cancelRequests: cancel}
	s.http = &http.Server{
		Handler:           s.running.track(a.handler),
		BaseContext:       func(net.Listener) context.Context { return requests },
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	if err := s.listen(s.http, cfg.HTTPAddr, "listening"); err != nil {
		return nil, err
	}
	if !cfg.MetricsOnHTTPAddr() {
		s.metrics = &http.Server{Handler: a.metrics, ReadHeaderTimeout: 5 * time.Second}
		if err := s.listen(s.metrics, cfg.MetricsAddr, "metrics listening"); err != nil {
			_ = s.http.Close()
			return nil, fmt.Errorf("metrics listener: %w", err)
		}
	}
	if cfg.Dev() {
		log.Warn("dev credentials in use (SHOP_ENV=dev): never expose this instance",
			"get_a_token", "SHOP_ENV=dev go run ./cmd/shop token 1", "admin_token", config.DevAdminToken)
	}
	return s, nil
}

func (s *server) listen(srv *http.Server, addr, msg string) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	go func() { s.failed <- srv.Serve(ln) }()
	s.log.Info(msg, "addr", ln.Addr().String(), "backend", s.cfg.LockBackend, "stock_strategy", s.cfg.StockStrategy)
	return nil
}

func (s *server) closeListeners() {
	_ = s.http.Close()
	if s.metrics != nil {
		_ = s.metrics.Close()
	}
}

// drain fails readiness for the drain delay, then closes the listener and
// lets in-flight requests finish within the shutdown timeout; those that
// outlive it are cancelled. It returns an error if any had to be.
func (s *server) drain() error {
	s.log.Info("shutting down: readiness fails, then the listener closes",
		"drain_delay", s.cfg.DrainDelay, "timeout", s.cfg.ShutdownTimeout)
	s.app.stopping.Store(true)
	time.Sleep(s.cfg.DrainDelay)

	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if s.http.Shutdown(sctx) == nil {
		return nil
	}
	s.log.Warn("cancelling the requests still running", "requests", s.running.count(), "timeout", s.cfg.ShutdownTimeout)
	s.cancelRequests(errShuttingDown)
	return fmt.Errorf("shutdown: in-flight requests outlived %s and were cancelled", s.cfg.ShutdownTimeout)
}

// stop waits up to cancelGrace for the last handler to return, lets the
// answers reach their clients, closes the metrics listener last (so that
// the drain itself can be scraped), and closes the stores: only when no
// handler runs any more. It returns cause, or why the stores stayed open.
func (s *server) stop(cause error) error {
	defer s.cancelRequests(nil)
	gctx, cancel := context.WithTimeout(context.Background(), cancelGrace)
	defer cancel()
	if s.running.wait(gctx) != nil {
		stuck := s.running.count() // before the listeners close, which ends some of them
		s.closeListeners()
		return errors.Join(cause, fmt.Errorf("shutdown: %d handlers ignored their cancellation for %s; exiting with the stores open",
			stuck, cancelGrace))
	}
	if s.http.Shutdown(gctx) != nil {
		_ = s.http.Close()
	}
	if s.metrics != nil {
		mctx, mcancel := context.WithTimeout(context.Background(), time.Second)
		defer mcancel()
		if s.metrics.Shutdown(mctx) != nil {
			_ = s.metrics.Close()
		}
	}
	if err := s.app.close(); err != nil {
		s.log.Warn("close", "err", err)
	}
	s.log.Info("stores closed")
	if cause == nil {
		s.log.Info("stopped")
	}
	return cause
}

// inflight counts running handlers, so that shutdown can wait for the last
// one to return before it closes the stores they use.
type inflight struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while n is 0
}

func (f *inflight) track(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.add(1)
		defer f.add(-1)
		h.ServeHTTP(w, r)
	})
}

func (f *inflight) add(d int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n == 0 {
		f.idle = make(chan struct{})
	}
	f.n += d
	if f.n == 0 {
		close(f.idle)
		f.idle = nil
	}
}

func (f *inflight) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// wait returns nil once no handler runs, or ctx's error.
func (f *inflight) wait(ctx context.Context) error {
	for {
		f.mu.Lock()
		idle := f.idle
		f.mu.Unlock()
		if idle == nil {
			return nil
		}
		select {
		case <-idle:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
