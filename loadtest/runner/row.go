package main

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/lockbench/shop/loadtest/runner/report"
)

// SKUs the runner puts on sale after the reset. The hot one has the stock
// of -stock; the order SKU has more than any run can sell, so that orders
// race on their idempotency keys, not on stock.
const (
	hotSKU   = "lt-hot"
	orderSKU = "lt-order"
	// limitedSKU is the loadtest fixture's SKU with a per-user limit; k6
	// reads the limit and stock from the service.
	limitedSKU = "lt-limited"
)

// row is one line of a run: a backend or strategy (spec) run with the
// run's settings and, once started, its world: a database of its own, its
// instances, the admin client and the users' tokens. close stops and drops
// it all.
type row struct {
	// runner is a copy of the run's: a row that offers a fraction of its
	// probed capacity sets its own rate and stock in o.
	runner
	spec report.Row
	sec  secrets
	db   rowDB
	urls []string
	adm  admin
	// tokens is the file of the users' tokens, for k6.
	tokens string
	// toolEnv is an instance's environment on a port of its own, for the
	// commands run against the row's world: migrate and the ceiling.
	toolEnv []string
	// instances serve the API; events is an events row's broker and
	// consumers (nil for the other rows). A restart replaces an entry.
	instances []*instance
	events    *eventRig
	cleanups  []func()
}

func (rn runner) newRow(spec report.Row) *row {
	return &row{runner: rn, spec: spec, sec: newSecrets()}
}

// start creates the row's database, migrates it, starts the instances
// and lays down the fixture. If it fails it undoes what it did; else the
// caller defers close.
func (r *row) start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	if err := r.createDatabase(ctx); err != nil {
		return err
	}
	if r.spec.IsEvents() {
		if err := r.startEvents(ctx); err != nil {
			return err
		}
	}
	if err := r.startInstances(ctx); err != nil {
		return err
	}
	r.adm = admin{url: r.urls[0], token: r.sec.admin}
	if err := r.setUp(ctx); err != nil {
		return err
	}
	if r.spec.IsEvents() {
		if err := r.startConsumers(ctx); err != nil {
			return err
		}
	}
	r.tokens = filepath.Join(r.o.out, "tokens-"+r.spec.Name+".json")
	r.cleanups = append(r.cleanups, func() { os.Remove(r.tokens) })
	return r.sec.writeTokens(r.tokens, r.o.Users)
}

// close undoes what the row set up, last first.
func (r *row) close() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
	r.cleanups = nil
}

// createDatabase creates the row's database, dropped again at close
// unless -keep.
func (r *row) createDatabase(ctx context.Context) error {
	db, err := r.env.mariadb.create(ctx, dbName(runID(), r.spec.Name))
	if err != nil {
		return err
	}
	r.db = db
	if r.o.keep {
		return nil
	}
	r.cleanups = append(r.cleanups, func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := r.env.mariadb.drop(dctx, db.name); err != nil {
			r.log.Warn("drop database", "database", db.name, "err", err)
		}
	})
	return nil
}

// startInstances migrates the database, then starts the row's instances
// and waits until every one is ready.
func (r *row) startInstances(ctx context.Context) error {
	port, err := freePort()
	if err != nil {
		return err
	}
	r.toolEnv = r.shopEnv(port)
	if err := migrate(ctx, r.o.shop, r.toolEnv, r.logPath("migrate")); err != nil {
		return err
	}
	if err := r.startReady(ctx, "serve", "shop", r.o.Instances, &r.instances); err != nil {
		return err
	}
	for _, in := range r.instances {
		r.urls = append(r.urls, in.url)
	}
	return nil
}

// startShop starts `shop <command>` with the row's environment on a port
// of its own, its output in the row's log of that name.
// startReady starts n processes of shop's command into *started, named
// name1 … name<n> in the logs, and waits until each is ready. The row's
// cleanups stop every one started, also after a failure half-way.
func (r *row) startReady(ctx context.Context, command, name string, n int, started *[]*instance) error {
	r.cleanups = append(r.cleanups, func() { stopAll(*started) })
	for i := range n {
		in, err := r.startShop(command, name+strconv.Itoa(i+1))
		if err != nil {
			return err
		}
		*started = append(*started, in)
	}
	for _, in := range *started {
		if err := in.waitReady(ctx, 60*time.Second); err != nil {
			return err
		}
	}
	return nil
}

func (r *row) startShop(command, logName string) (*instance, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := program{argv: []string{r.o.shop, command}, env: r.shopEnv(port), logPath: r.logPath(logName)}
	return p.startInstance(port, os.O_TRUNC)
}

// setUp lays down the loadtest fixture and the run's two SKUs.
func (r *row) setUp(ctx context.Context) error {
	if err := r.adm.do(ctx, http.MethodPost, "/admin/v1/reset", map[string]string{"fixture": "loadtest"}, nil); err != nil {
		return err
	}
	for _, p := range []product{
		{SKU: hotSKU, Name: "Load test hot item", Stock: r.o.Stock, PriceCents: 1_000},
		{SKU: orderSKU, Name: "Load test order item", Stock: 10_000_000, PriceCents: 100},
	} {
		if err := r.adm.addProduct(ctx, p); err != nil {
			return err
		}
	}
	return nil
}

// pids are the instances' process ids.
func (r *row) pids() []int {
	pids := make([]int, len(r.instances))
	for i, in := range r.instances {
		pids[i] = in.pid()
	}
	return pids
}

// logPath is where the row's process named what logs.
func (r *row) logPath(what string) string {
	return filepath.Join(r.o.out, "logs", r.spec.Name+"-"+what+".log")
}

// migrate runs `shop migrate` once, so that the instances do not race to
// create the same tables.
func migrate(ctx context.Context, shop string, env []string, logPath string) error {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, shop, "migrate")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	_ = os.WriteFile(logPath, out, 0o644)
	if err != nil {
		return fmt.Errorf("shop migrate: %w: %s", err, tail(out))
	}
	return nil
}

// tail is the end of a command's output, enough to say what went wrong.
func tail(b []byte) string {
	const n = 2000
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}
