// Command shop is the reference microservice for distributed locks.
//
//	shop serve                    run the HTTP service (config from SHOP_* variables)
//	shop consume                  run the order-event consumer (loyalty points)
//	shop migrate                  create or extend the database tables, then exit
//	shop token <user> [-ttl 24h]  print a user token signed with SHOP_JWT_SECRET
//	shop healthcheck              exit 0 if this host's shop answers /readyz with 200, else 1
//	shop version                  print the version, VCS revision and Go version
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

// commands are shop's commands as its usage lists them; run dispatches
// them.
var commands = []struct{ name, synopsis, summary, help string }{
	{"serve", "serve", "run the HTTP service (config: SHOP_* variables, docs/config.md)",
		`Runs the HTTP service until SIGTERM or SIGINT. Configuration comes from the
SHOP_* variables (docs/config.md); SHOP_ENV defaults to production, which
needs SHOP_JWT_SECRET and SHOP_ADMIN_TOKEN of 32 bytes or more. For a
developer's machine: SHOP_ENV=dev shop serve.
`},
	{"consume", "consume", "run the order-event consumer (loyalty points) until SIGTERM",
		`Runs the loyalty-points consumer of the order events on SHOP_NATS_URL until
SIGTERM or SIGINT: a durable JetStream pull consumer that credits each paid
order's points once, deduplicating as SHOP_EVENTS_DEDUP says (docs/events.md).
It serves /healthz, /readyz and /metrics on SHOP_HTTP_ADDR, and no API.
Several may run: they share the durable consumer.
`},
	{"migrate", "migrate", "create or extend the database tables, then exit",
		`Creates or extends the tables of the database SHOP_MYSQL_DSN or
SHOP_SQLITE_PATH names (never drops or narrows one), then exits.
`},
	{"token", "token <user id> [-ttl 24h]", "print a user token signed with SHOP_JWT_SECRET",
		`Prints a user token for <user id> (a positive integer), signed with
SHOP_JWT_SECRET, valid for -ttl.
`},
	{"healthcheck", "healthcheck", "exit 0 if the shop at SHOP_HTTP_ADDR on this host is ready, else 1",
		`GET /readyz of the shop at SHOP_HTTP_ADDR on this host: exit 0 on 200, else
1 and the reason on stderr. It reads no other variable.
`},
	{"version", "version", "print the version, VCS revision and Go version",
		`Prints the version, VCS revision and Go version of this binary.
`},
}

// usage is shop's own help, one line per command.
func usage() string {
	var b strings.Builder
	b.WriteString("usage:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  shop %-25s %s\n", c.synopsis, c.summary)
	}
	b.WriteString("  shop <command> -help          that command's help\n\n")
	b.WriteString("Development, with the public dev secrets:  SHOP_ENV=dev shop serve\n")
	return b.String()
}

// commandUsage is the help of command name, "" for no command.
func commandUsage(name string) string {
	for _, c := range commands {
		if c.name == name {
			return "usage: shop " + c.synopsis + "\n\n" + c.help
		}
	}
	return ""
}

// call is what a command runs with.
type call struct {
	getenv         func(string) string
	cfg            config.Config // read by configured
	log            *slog.Logger
	stdout, stderr io.Writer
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
		fmt.Fprint(stderr, usage())
		return 2
	}
	c := call{getenv: getenv, stdout: stdout, stderr: stderr}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		if u := commandUsage(strings.Join(rest, " ")); u != "" {
			fmt.Fprint(stdout, u)
		} else {
			fmt.Fprint(stdout, usage())
		}
		return 0
	case "serve":
		return c.plain(name, rest, func(c call) int { return c.configured(runServe) })
	case "consume":
		return c.plain(name, rest, func(c call) int { return c.configured(runConsume) })
	case "migrate":
		return c.plain(name, rest, func(c call) int { return c.configured(runMigrate) })
	case "token":
		return c.token(rest)
	case "healthcheck":
		return c.plain(name, rest, runHealthcheck)
	case "version":
		return c.plain(name, rest, runVersion)
	}
	fmt.Fprintf(stderr, "shop: unknown command %q\n%s", name, usage())
	return 2
}

// plain runs command name, which takes no flags and no arguments.
func (c call) plain(name string, args []string, run func(call) int) int {
	if _, code, ok := c.parse(name, flagSet(name), args, nil); !ok {
		return code
	}
	return run(c)
}

// token checks its user id and -ttl before it reads the configuration.
func (c call) token(args []string) int {
	fs := flagSet("token")
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token is valid")
	pos, code, ok := c.parse("token", fs, args, []string{"user id"})
	if !ok {
		return code
	}
	id, err := userID(pos[0])
	if err == nil && *ttl <= 0 {
		err = fmt.Errorf("-ttl must be positive, not %s", *ttl)
	}
	if err != nil {
		return c.refuse("token", err)
	}
	return c.configured(func(c call) int { return token(c.cfg, id, *ttl, c.stdout, c.stderr) })
}

func flagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return fs
}

// parse reads command name's flags (declared on fs) and its positional
// arguments, one for each of want. Unless ok, it has answered: the
// command's help (exit 0), or what is wrong with the command line (exit 2).
func (c call) parse(name string, fs *flag.FlagSet, args, want []string) (pos []string, code int, ok bool) {
	pos, err := parseInterspersed(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(c.stdout, commandUsage(name))
		return nil, 0, false
	}
	switch n := len(want); {
	case err != nil:
	case len(pos) < n:
		err = fmt.Errorf("missing the %s", strings.Join(want[len(pos):], ", the "))
	case len(pos) == n+1:
		err = fmt.Errorf("unexpected argument %q", pos[n])
	case len(pos) > n:
		err = fmt.Errorf("unexpected arguments %q", pos[n:])
	}
	if err != nil {
		return nil, c.refuse(name, err), false
	}
	return pos, 0, true
}

// refuse reports a wrong command line: exit 2.
func (c call) refuse(name string, err error) int {
	fmt.Fprintf(c.stderr, "shop %s: %v\n%s", name, err, commandUsage(name))
	return 2
}

// configured runs run with the configuration and the logger, or reports
// the configuration's errors: exit 2.
func (c call) configured(run func(call) int) int {
	if err := c.configure(); err != nil {
		fmt.Fprintf(c.stderr, "shop: invalid configuration:\n%v\n", err)
		return 2
	}
	return run(c)
}

// configure reads the configuration and makes the process's logger.
func (c *call) configure() (err error) {
	if c.cfg, err = config.Load(c.getenv); err != nil {
		return err
	}
	c.log = newLogger(c.cfg, c.stdout)
	slog.SetDefault(c.log)
	// go-redis prints its own plain lines to stderr, which would break a
	// JSON log stream; route them through slog.
	redis.SetLogger(redisLogger{c.log})
	return nil
}

// parseInterspersed returns the positional arguments in their order, with
// flags allowed before, between and after them (shop token 1 -ttl 1h);
// everything after "--" is positional.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		left := fs.Args()
		if len(left) == 0 {
			return pos, nil
		}
		if consumed := len(args) - len(left); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, left...), nil
		}
		pos, args = append(pos, left[0]), left[1:]
	}
}

func runServe(c call) int { return runServer(c, newApp) }

// runConsume refuses, as a configuration error and before opening
// anything, to run without a broker.
func runConsume(c call) int {
	if c.cfg.Events.EmbeddedNATS() {
		fmt.Fprintln(c.stderr, "shop: invalid configuration:\nSHOP_NATS_URL is required by shop consume: the broker the shop instances publish order events to")
		return 2
	}
	return runServer(c, newConsumeApp)
}

// runServer serves the app open makes until SIGTERM or SIGINT.
func runServer(c call, open appOpener) int {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	shutdownTracing, err := setupTracing(ctx, c.getenv)
	if err != nil {
		c.log.Error("tracing", "err", err)
		return 1
	}
	defer func() {
		// Flush the spans of the last requests, briefly: an unreachable
		// collector must not hold the exit.
		fctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdownTracing(fctx)
	}()
	if err := serveApp(ctx, c.cfg, c.log, open); err != nil {
		c.log.Error("shop stopped", "err", err)
		return 1
	}
	return 0
}

func runMigrate(c call) int {
	if err := migrate(context.Background(), c.cfg); err != nil {
		c.log.Error("migrate failed", "err", err)
		return 1
	}
	c.log.Info("migrated")
	return 0
}

func runVersion(c call) int {
	fmt.Fprintln(c.stdout, readBuildInfo())
	return 0
}

// runHealthcheck needs one variable, and must answer 0 or 1 only (Docker
// reserves 2), whatever else the environment holds.
func runHealthcheck(c call) int {
	if err := healthcheck(c.getenv("SHOP_HTTP_ADDR"), healthcheckTimeout); err != nil {
		fmt.Fprintf(c.stderr, "shop healthcheck: %v\n", err)
		return 1
	}
	return 0
}

func userID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	switch {
	case err != nil:
		return 0, fmt.Errorf("user id %q is not a number", s)
	case id <= 0:
		return 0, fmt.Errorf("user id %q is not a positive integer", s)
	}
	return id, nil
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

func migrate(ctx context.Context, cfg config.Config) error {
	db, err := storage.Open(ctx, storage.Options{MySQLDSN: cfg.MySQLDSN, SQLitePath: cfg.SQLitePath, MaxConns: 1})
	if err != nil {
		return err
	}
	defer db.Close()
	return migrateAll(ctx, db)
}

func token(cfg config.Config, id int64, ttl time.Duration, stdout, stderr io.Writer) int {
	tok, err := auth.New([]byte(cfg.JWTSecret), cfg.AdminToken, auth.MaxLifetime(cfg.JWTMaxTTL)).Token(id, ttl, time.Now())
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
