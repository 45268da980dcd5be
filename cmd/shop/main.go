// Command shop is the reference microservice for distributed locks.
//
//	shop serve                    run the HTTP service (config from SHOP_* variables)
//	shop migrate                  create or extend the database tables, then exit
//	shop token <user> [-ttl 24h]  print a user token signed with SHOP_JWT_SECRET
//	shop healthcheck              exit 0 if this host's shop answers /readyz with 200, else 1
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
  shop ceiling [-n 300]         time the serialized part of one hot-SKU purchase (capacity runs)
`

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// run is main with its inputs and outputs explicit; it returns the exit code.
func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	// Before config.Load: the probe needs one variable, and must answer 0 or
	// 1 only (Docker reserves 2), whatever else the environment holds.
	if args[0] == "healthcheck" {
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

	switch args[0] {
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
	case "token":
		return token(cfg, args[1:], stdout, stderr)
	case "ceiling":
		return ceiling(context.Background(), cfg, args[1:], stdout, stderr)
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "shop: unknown command %q\n%s", args[0], usage)
	return 2
}

func newLogger(cfg config.Config, w io.Writer) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

type redisLogger struct{ log *slog.Logger }

func (r redisLogger) Printf(ctx context.Context, format string, v ...any) {
	r.log.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

// serve runs until ctx ends (SIGTERM/SIGINT), then stops accepting, lets
// in-flight requests finish (each releases its locks as its handler
// returns) for up to cfg.ShutdownTimeout, and closes the locker and clients.
func serve(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	log.Info("starting", "config", cfg)
	a, err := newApp(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer func() {
		if err := a.close(); err != nil {
			log.Warn("close", "err", err)
		}
	}()

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           a.handler,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String(), "backend", cfg.LockBackend, "stock_strategy", cfg.StockStrategy)
	if cfg.Dev() {
		log.Warn("dev credentials in use (SHOP_ENV=dev): never expose this instance",
			"get_a_token", "go run ./cmd/shop token 1", "admin_token", config.DevAdminToken)
	}

	select {
	case err := <-serveErr:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down", "timeout", cfg.ShutdownTimeout)
	a.stopping.Store(true)
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Requests still running are cut; their leases end with their TTL.
		_ = srv.Close()
		return fmt.Errorf("shutdown: in-flight requests outlived %s: %w", cfg.ShutdownTimeout, err)
	}
	if err := <-serveErr; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	log.Info("stopped")
	return nil
}

func migrate(ctx context.Context, cfg config.Config) error {
	db, err := storage.Open(ctx, storage.Options{MySQLDSN: cfg.MySQLDSN, SQLitePath: cfg.SQLitePath, MaxConns: 1})
	if err != nil {
		return err
	}
	defer db.Close()
	return db.Migrate(ctx, models()...)
}

func token(cfg config.Config, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token is valid")
	// Accept the flag before or after the user id.
	var user string
	if len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-' {
		user, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if user == "" && fs.NArg() > 0 {
		user = fs.Arg(0)
	}
	id, err := strconv.ParseInt(user, 10, 64)
	if err != nil || id <= 0 || *ttl <= 0 {
		fmt.Fprint(stderr, "usage: shop token <user id, a positive integer> [-ttl 24h]\n")
		return 2
	}
	tok, err := auth.New([]byte(cfg.JWTSecret), cfg.AdminToken).Token(id, *ttl, time.Now())
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
