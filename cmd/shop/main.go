// Command shop is the reference microservice for distributed locks.
//
//	shop serve                    run the HTTP service (config from SHOP_* variables)
//	shop migrate                  create or extend the database tables, then exit
//	shop token <user> [-ttl 24h]  print a user token signed with SHOP_JWT_SECRET
//	shop healthcheck              exit 0 if this host's shop answers /readyz with 200, else 1
//	shop version                  print the version, VCS revision and Go version
//	shop ceiling [-n 300]         time the serialized part of one hot-SKU purchase (capacity runs)
//
// docs/config.md lists the variables, docs/api.md the routes.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/storage"
)

const usage = `usage:
  shop serve                    run the HTTP service (config: SHOP_* variables, docs/config.md)
  shop migrate                  create or extend the database tables, then exit
  shop token <user> [-ttl 24h]  print a user token signed with SHOP_JWT_SECRET
  shop healthcheck              exit 0 if the shop at SHOP_HTTP_ADDR on this host is ready, else 1
  shop version                  print the version, VCS revision and Go version
  shop ceiling [-n 300]         time the serialized part of one hot-SKU purchase (capacity runs)
  shop <command> -help          that command's help

Development, with the public dev secrets:  SHOP_ENV=dev shop serve
`

// commands is each command's one-paragraph help, printed by -h/--help.
var commands = map[string]string{
	"serve": `usage: shop serve

Runs the HTTP service until SIGTERM or SIGINT. Configuration comes from the
SHOP_* variables (docs/config.md); SHOP_ENV defaults to production, which
needs SHOP_JWT_SECRET and SHOP_ADMIN_TOKEN of 32 bytes or more. For a
developer's machine: SHOP_ENV=dev shop serve.
`,
	"migrate": `usage: shop migrate

Creates or extends the tables of the database SHOP_MYSQL_DSN or
SHOP_SQLITE_PATH names (never drops or narrows one), then exits.
`,
	"token": `usage: shop token <user id> [-ttl 24h]

Prints a user token for <user id> (a positive integer), signed with
SHOP_JWT_SECRET, valid for -ttl.
`,
	"healthcheck": `usage: shop healthcheck

GET /readyz of the shop at SHOP_HTTP_ADDR on this host: exit 0 on 200, else
1 and the reason on stderr. It reads no other variable.
`,
	"version": `usage: shop version

Prints the version, VCS revision and Go version of this binary.
`,
	"ceiling": `usage: shop ceiling [-n 300] [-sku lt-ceiling]

Buys -n units of -sku (created or reset first) one at a time through the
configured strategy and lock backend, and prints as JSON the median time
that other buyers of the same SKU must wait for each sale, and its inverse,
the ceiling of that SKU's rate. make capacity prints it beside the rate it
measured.
`,
}

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run is main with its inputs and outputs explicit; it returns the exit
// code: 0 done, 1 failed, 2 the command line or the configuration is wrong.
// Arguments and help are handled before the configuration is read, so that
// help works whatever the environment holds and a wrong argument never
// starts anything.
func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if len(rest) == 1 && commands[rest[0]] != "" {
			fmt.Fprint(stdout, commands[rest[0]])
			return 0
		}
		fmt.Fprint(stdout, usage)
		return 0
	}
	help, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "shop: unknown command %q\n%s", name, usage)
		return 2
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token is valid")
	sales := fs.Int("n", 300, "ceiling: sales to time")
	sku := fs.String("sku", "lt-ceiling", "ceiling: SKU to create and sell")
	if name == "token" && len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		// The user id may come before the flag: shop token 1 -ttl 1h.
		rest = append(rest[1:], rest[0])
	}
	switch err := fs.Parse(rest); {
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprint(stdout, help)
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "shop %s: %v\n%s", name, err, help)
		return 2
	case name != "token" && name != "ceiling" && fs.NFlag() > 0:
		fmt.Fprintf(stderr, "shop %s: takes no flags\n%s", name, help)
		return 2
	}
	wantArgs := 0
	if name == "token" {
		wantArgs = 1
	}
	if fs.NArg() != wantArgs {
		fmt.Fprintf(stderr, "shop %s: unexpected arguments %q\n%s", name, fs.Args(), help)
		return 2
	}

	switch name {
	case "version":
		fmt.Fprintln(stdout, readBuildInfo())
		return 0
	case "healthcheck":
		// The probe needs one variable, and must answer 0 or 1 only (Docker
		// reserves 2), whatever else the environment holds.
		if err := healthcheck(getenv("SHOP_HTTP_ADDR"), healthcheckTimeout); err != nil {
			fmt.Fprintf(stderr, "shop healthcheck: %v\n", err)
			return 1
		}
		return 0
	}
	cfg, err := config.Load(getenv)
	if err != nil {
		fmt.Fprintf(stderr, "shop: invalid configuration:\n%v\n", err)
		return 2
	}
	log := newLogger(cfg, stdout)
	slog.SetDefault(log)
	// go-redis prints its own plain lines to stderr, which would break a
	// JSON log stream; route them through slog.
	redis.SetLogger(redisLogger{log})

	switch name {
	case "serve":
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		if err := serve(ctx, cfg, log); err != nil {
			log.Error("shop stopped", "err", err)
			return 1
		}
		return 0
	case "migrate":
		if err := migrate(context.Background(), cfg); err != nil {
			log.Error("migrate failed", "err", err)
			return 1
		}
		log.Info("migrated")
		return 0
	case "ceiling":
		return ceiling(context.Background(), cfg, *sales, *sku, stdout, stderr)
	default: // token
		return token(cfg, fs.Arg(0), *ttl, stdout, stderr)
	}
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		return slog.New(requestIDHandler{slog.NewJSONHandler(w, opts)})
	}
	return slog.New(requestIDHandler{slog.NewTextHandler(w, opts)})
}

type redisLogger struct{ log *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.log.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

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
	log.Info("starting", "version", readBuildInfo().String(), "config", cfg)
	a, err := newApp(ctx, cfg, log)
	if err != nil {
		return err
	}
	closeStores := true
	defer func() {
		if !closeStores {
			return
		}
		if err := a.close(); err != nil {
			log.Warn("close", "err", err)
		}
		log.Info("stores closed")
	}()

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return err
	}
	// Requests live on a context of their own: SIGTERM must not cancel
	// them, only an overrun shutdown timeout does.
	requests, cancelRequests := context.WithCancelCause(context.Background())
	defer cancelRequests(nil)
	var running inflight
	srv := &http.Server{
		Handler:           running.track(a.handler),
		BaseContext:       func(net.Listener) context.Context { return requests },
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String(), "backend", cfg.LockBackend, "stock_strategy", cfg.StockStrategy)

	var metricsSrv *http.Server
	if cfg.MetricsAddr != "" {
		mln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			_ = srv.Close()
			return fmt.Errorf("metrics listener: %w", err)
		}
		metricsSrv = &http.Server{Handler: a.metrics, ReadHeaderTimeout: 5 * time.Second}
		go func() { serveErr <- metricsSrv.Serve(mln) }()
		log.Info("metrics listening", "addr", mln.Addr().String())
	}
	if cfg.Dev() {
		log.Warn("dev credentials in use (SHOP_ENV=dev): never expose this instance",
			"get_a_token", "SHOP_ENV=dev go run ./cmd/shop token 1", "admin_token", config.DevAdminToken)
	}

	select {
	case err := <-serveErr:
		// A listener failed: stop at once, but still never close a store
		// under a running handler.
		cancelRequests(errShuttingDown)
		_ = srv.Close()
		if metricsSrv != nil {
			_ = metricsSrv.Close()
		}
		gctx, gcancel := context.WithTimeout(context.Background(), cancelGrace)
		defer gcancel()
		if running.wait(gctx) != nil {
			closeStores = false
		}
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: readiness fails, then the listener closes",
		"drain_delay", cfg.DrainDelay, "timeout", cfg.ShutdownTimeout)
	a.stopping.Store(true)
	time.Sleep(cfg.DrainDelay)

	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	var overrun error
	if err := srv.Shutdown(sctx); err != nil {
		overrun = fmt.Errorf("shutdown: in-flight requests outlived %s and were cancelled", cfg.ShutdownTimeout)
		log.Warn("cancelling the requests still running", "requests", running.count(), "timeout", cfg.ShutdownTimeout)
		cancelRequests(errShuttingDown)
		gctx, gcancel := context.WithTimeout(context.Background(), cancelGrace)
		defer gcancel()
		if err := running.wait(gctx); err != nil {
			closeStores = false
			return fmt.Errorf("shutdown: %d handlers ignored their cancellation for %s; exiting with the stores open",
				running.count(), cancelGrace)
		}
		// Let the cancelled requests' answers reach their clients.
		if err := srv.Shutdown(gctx); err != nil {
			_ = srv.Close()
		}
	}
	if metricsSrv != nil {
		// Last, so that the drain itself can be scraped.
		mctx, mcancel := context.WithTimeout(context.Background(), time.Second)
		defer mcancel()
		if err := metricsSrv.Shutdown(mctx); err != nil {
			_ = metricsSrv.Close()
		}
	}
	if overrun != nil {
		return overrun
	}
	log.Info("stopped")
	return nil
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

func migrate(ctx context.Context, cfg config.Config) error {
	db, err := storage.Open(ctx, storage.Options{MySQLDSN: cfg.MySQLDSN, SQLitePath: cfg.SQLitePath, MaxConns: 1})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Migrate(ctx, models()...)
}

func token(cfg config.Config, user string, ttl time.Duration, stdout, stderr io.Writer) int {
	id, err := strconv.ParseInt(user, 10, 64)
	if err != nil || id <= 0 || ttl <= 0 {
		fmt.Fprint(stderr, commands["token"])
		return 2
	}
	tok, err := auth.New([]byte(cfg.JWTSecret), cfg.AdminToken).Token(id, ttl, time.Now())
	if err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	fmt.Fprintln(stdout, tok)
	return 0
}

// healthcheckTimeout stays under the compose healthcheck's 3 s timeout, so
// that a hung shop is reported by this probe, with a reason, rather than
// killed by Docker without one.
const healthcheckTimeout = 2 * time.Second

// healthcheck is the container's probe (the distroless image has no shell
// or curl): GET /readyz of the shop listening on addr, on this host.
// It returns nil on 200 and otherwise an error of one line saying why.
func healthcheck(addr string, timeout time.Duration) error {
	target, err := probeURL(addr)
	if err != nil {
		return err
	}
	client := &http.Client{
		Timeout: timeout,
		// A loopback probe must not go through HTTP_PROXY.
		Transport: &http.Transport{Proxy: nil, DisableKeepAlives: true},
	}
	res, err := client.Get(target)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode == http.StatusOK {
		return nil
	}
	// /readyz names the dependencies that are down in its problem detail.
	var p struct {
		Detail string `json:"detail"`
	}
	_ = json.NewDecoder(io.LimitReader(res.Body, 4<<10)).Decode(&p)
	if p.Detail == "" {
		return fmt.Errorf("GET %s: %s", target, res.Status)
	}
	return fmt.Errorf("GET %s: %s: %s", target, res.Status, strings.ReplaceAll(p.Detail, "\n", " "))
}

// probeURL is the /readyz URL of a shop listening on addr (SHOP_HTTP_ADDR,
// empty for the default). A wildcard or empty host is reached on
// 127.0.0.1: the probe runs inside the container, which "[::]" also covers,
// since Go listens on both families there.
func probeURL(addr string) (string, error) {
	if addr = strings.TrimSpace(addr); addr == "" {
		addr = config.DefaultHTTPAddr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("SHOP_HTTP_ADDR is %q; want host:port or :port", addr)
	}
	if n, err := strconv.Atoi(port); err != nil || n <= 0 || n > 65535 {
		return "", fmt.Errorf("SHOP_HTTP_ADDR is %q: port %q cannot be probed (0 picks a port the probe cannot know)", addr, port)
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port) + "/readyz", nil
}
