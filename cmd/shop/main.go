// Command shop is the reference microservice for distributed locks.
//
//	shop serve                    run the HTTP service (config from SHOP_* variables)
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

// command is one row of shop's command table.
type command struct {
	name     string
	synopsis string // its form in shop's usage, after "shop "
	summary  string // its line in shop's usage
	help     string // printed by shop <name> -help
	args     []string
	// config: run needs the configuration and the logger; they are read
	// only after the arguments are checked, so that a wrong argument is
	// reported as such whatever the environment holds.
	config bool
	// bind declares the command's flags on fs and returns its check of the
	// parsed arguments (already counted against args) and its run.
	bind func(fs *flag.FlagSet) (check func(args []string) error, run func(c call) int)
}

// call is what a command runs with.
type call struct {
	args           []string
	getenv         func(string) string
	cfg            config.Config // zero unless the command's config is set
	log            *slog.Logger
	stdout, stderr io.Writer
}

func commands() []command {
	return []command{
		{name: "serve", synopsis: "serve", summary: "run the HTTP service (config: SHOP_* variables, docs/config.md)",
			config: true, bind: noFlags(runServe),
			help: `Runs the HTTP service until SIGTERM or SIGINT. Configuration comes from the
SHOP_* variables (docs/config.md); SHOP_ENV defaults to production, which
needs SHOP_JWT_SECRET and SHOP_ADMIN_TOKEN of 32 bytes or more. For a
developer's machine: SHOP_ENV=dev shop serve.
`},
		{name: "migrate", synopsis: "migrate", summary: "create or extend the database tables, then exit",
			config: true, bind: noFlags(runMigrate),
			help: `Creates or extends the tables of the database SHOP_MYSQL_DSN or
SHOP_SQLITE_PATH names (never drops or narrows one), then exits.
`},
		{name: "token", synopsis: "token <user id> [-ttl 24h]", summary: "print a user token signed with SHOP_JWT_SECRET",
			args: []string{"user id"}, config: true, bind: bindToken,
			help: `Prints a user token for <user id> (a positive integer), signed with
SHOP_JWT_SECRET, valid for -ttl.
`},
		{name: "healthcheck", synopsis: "healthcheck", summary: "exit 0 if the shop at SHOP_HTTP_ADDR on this host is ready, else 1",
			bind: noFlags(runHealthcheck),
			help: `GET /readyz of the shop at SHOP_HTTP_ADDR on this host: exit 0 on 200, else
1 and the reason on stderr. It reads no other variable.
`},
		{name: "version", synopsis: "version", summary: "print the version, VCS revision and Go version",
			bind: noFlags(runVersion),
			help: `Prints the version, VCS revision and Go version of this binary.
`},
	}
}

func (c command) usage() string { return "usage: shop " + c.synopsis + "\n\n" + c.help }

// usage is shop's own help, one line per command from the table.
func usage() string {
	var b strings.Builder
	b.WriteString("usage:\n")
	for _, c := range commands() {
		fmt.Fprintf(&b, "  shop %-25s %s\n", c.synopsis, c.summary)
	}
	b.WriteString("  shop <command> -help          that command's help\n\n")
	b.WriteString("Development, with the public dev secrets:  SHOP_ENV=dev shop serve\n")
	return b.String()
}

func lookup(name string) (command, bool) {
	for _, c := range commands() {
		if c.name == name {
			return c, true
		}
	}
	return command{}, false
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
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		help(rest, stdout)
		return 0
	}
	cmd, ok := lookup(name)
	if !ok {
		fmt.Fprintf(stderr, "shop: unknown command %q\n%s", name, usage())
		return 2
	}
	c := call{getenv: getenv, stdout: stdout, stderr: stderr}
	exec, err := cmd.parse(rest, &c)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, cmd.usage())
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "shop %s: %v\n%s", name, err, cmd.usage())
		return 2
	}
	if cmd.config {
		if err := c.configure(); err != nil {
			fmt.Fprintf(stderr, "shop: invalid configuration:\n%v\n", err)
			return 2
		}
	}
	return exec(c)
}

// help prints the help of the command args name, or shop's own.
func help(args []string, stdout io.Writer) {
	if c, ok := lookup(strings.Join(args, " ")); ok {
		fmt.Fprint(stdout, c.usage())
		return
	}
	fmt.Fprint(stdout, usage())
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

// parse reads the command's flags and arguments into c, checks them, and
// returns the command's run.
func (cmd command) parse(args []string, c *call) (func(call) int, error) {
	fs := flag.NewFlagSet(cmd.name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	check, exec := cmd.bind(fs)
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return nil, err
	}
	switch want := len(cmd.args); {
	case len(pos) < want:
		return nil, fmt.Errorf("missing the %s", strings.Join(cmd.args[len(pos):], ", the "))
	case len(pos) == want+1:
		return nil, fmt.Errorf("unexpected argument %q", pos[want])
	case len(pos) > want:
		return nil, fmt.Errorf("unexpected arguments %q", pos[want:])
	}
	if err := check(pos); err != nil {
		return nil, err
	}
	c.args = pos
	return exec, nil
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

// noFlags binds a command that takes no flags and whose arguments need no
// check beyond their count.
func noFlags(run func(call) int) func(*flag.FlagSet) (func([]string) error, func(call) int) {
	return func(*flag.FlagSet) (func([]string) error, func(call) int) {
		return func([]string) error { return nil }, run
	}
}

func runServe(c call) int {
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
	if err := serve(ctx, c.cfg, c.log); err != nil {
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

func bindToken(fs *flag.FlagSet) (func([]string) error, func(call) int) {
	ttl := fs.Duration("ttl", 24*time.Hour, "how long the token is valid")
	check := func(args []string) error {
		if _, err := userID(args[0]); err != nil {
			return err
		}
		if *ttl <= 0 {
			return fmt.Errorf("-ttl must be positive, not %s", *ttl)
		}
		return nil
	}
	return check, func(c call) int {
		id, _ := userID(c.args[0])
		return token(c.cfg, id, *ttl, c.stdout, c.stderr)
	}
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
