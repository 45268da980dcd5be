package faults

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/order"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
)

// lyingDriver is the MySQL driver with one fault: while lies > 0, a
// transaction whose COMMIT succeeded reports mysql.ErrInvalidConn, as
// when the connection breaks between the server's commit and its answer.
// The caller cannot tell this from a commit that failed.
type lyingDriver struct {
	driver.Driver
	lies *atomic.Int32
}

func (d lyingDriver) Open(dsn string) (driver.Conn, error) {
	c, err := d.Driver.Open(dsn)
	if err != nil {
		return nil, err
	}
	return &lyingConn{Conn: c, lies: d.lies}, nil
}

type lyingConn struct {
	driver.Conn
	lies *atomic.Int32
}

func (c *lyingConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.(driver.ConnBeginTx).BeginTx(ctx, opts)
	if err != nil {
		return nil, err
	}
	return &lyingTx{Tx: tx, lies: c.lies}, nil
}

func (c *lyingConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	return c.Conn.(driver.ExecerContext).ExecContext(ctx, q, args)
}

func (c *lyingConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	return c.Conn.(driver.QueryerContext).QueryContext(ctx, q, args)
}

func (c *lyingConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	return c.Conn.(driver.ConnPrepareContext).PrepareContext(ctx, q)
}

func (c *lyingConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.Conn.(driver.NamedValueChecker).CheckNamedValue(nv)
}

func (c *lyingConn) ResetSession(ctx context.Context) error {
	return c.Conn.(driver.SessionResetter).ResetSession(ctx)
}

type lyingTx struct {
	driver.Tx
	lies *atomic.Int32
}

func (t *lyingTx) Commit() error {
	if err := t.Tx.Commit(); err != nil {
		return err
	}
	if t.lies.Add(-1) >= 0 {
		return mysql.ErrInvalidConn
	}
	t.lies.Store(0)
	return nil
}

// TestOrderCommitReportedAsFailed places, pays and closes orders through a
// driver that reports a landed commit as a failure. Each caller sees an
// error; the stores hold the whole change; the retry (the same key, the
// same pay, the next closer round) finds it done and does nothing twice.
func TestOrderCommitReportedAsFailed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	o := newLyingOrders(t)

	// Place and pay in one transaction: reported failed, landed.
	o.lie()
	if _, _, err := o.svc.Place(ctx, buyer, "k1", orderSKU, 2, true); !errors.Is(err, mysql.ErrInvalidConn) {
		t.Fatalf("place: %v; want the driver's error", err)
	}
	o.auditOK(t, "after the lying place")
	placed, existing, err := o.svc.Place(ctx, buyer, "k1", orderSKU, 2, true)
	if err != nil || !existing || placed.Status != order.StatusPaid {
		t.Fatalf("retry: %+v existing %v, %v; want the paid order found", placed, existing, err)
	}

	o.payReportedFailed(t)
	o.closeReportedFailed(t)
	o.auditOK(t, "after every retry")

	a, _ := o.accounts.Get(ctx, buyer)
	p, _ := o.products.Get(ctx, orderSKU)
	if a.Balance != opening-3*orderPrice || p.Stock != orderStock-3 {
		t.Fatalf("balance %d, stock %d; want %d and %d: each change once", a.Balance, p.Stock,
			opening-3*orderPrice, orderStock-3)
	}
	report(row{Fault: "7 order: commit reported failed", Backend: "redis", Stale: "3 lying commits; retries found them done"})
}

// lyingOrders is the order service on a lyingDriver, locked on Redis,
// with the buyer's account and the product in place.
type lyingOrders struct {
	lies     atomic.Int32
	svc      *order.Service
	accounts *account.Store
	products *inventory.Store
	auditor  *audit.Auditor
}

// lyingPayTimeout is how long an order may wait to be paid.
const lyingPayTimeout = 300 * time.Millisecond

func newLyingOrders(t *testing.T) *lyingOrders {
	t.Helper()
	ctx := context.Background()
	o := &lyingOrders{}
	db := o.openLyingDB(t)
	client := redis.NewClient(&redis.Options{Addr: shoptest.Env(t, "SHOP_TEST_REDIS_ADDR"), ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	locker, err := redislock.New(client, redislock.WithPrefix(shoptest.Prefix("faults-orders")))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Close() })

	o.accounts, o.products = account.NewStore(db), inventory.NewStore(db, nil)
	store := order.NewStore(db, o.products, o.accounts)
	o.svc = order.NewService(store, order.Options{Locking: guard.Locking{Locker: locker}, PayTimeout: lyingPayTimeout})
	if _, err := o.accounts.Put(ctx, buyer, opening); err != nil {
		t.Fatal(err)
	}
	if _, err := o.products.Put(ctx, inventory.Product{SKU: orderSKU, Name: orderSKU, Stock: orderStock, PriceCents: orderPrice}); err != nil {
		t.Fatal(err)
	}
	d := &order.Domain{Service: o.svc, Store: store}
	o.auditor = audit.New(append(append((&account.Domain{Store: o.accounts}).Checks(),
		(&inventory.Domain{Store: o.products}).Checks()...), d.Checks()...), nil)
	return o
}

// openLyingDB migrates the test database, then opens it again through a
// lyingDriver that lies while o.lies says so.
func (o *lyingOrders) openLyingDB(t *testing.T) *gorm.DB {
	t.Helper()
	ctx := context.Background()
	dsn := shoptest.MySQL(t)
	setup, err := storage.Open(ctx, storage.Options{MySQLDSN: dsn, MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { setup.Close() })
	if err := setup.Migrate(ctx, append(append(account.Models(), inventory.Models()...), order.Models()...)...); err != nil {
		t.Fatal(err)
	}

	name := "mysql-lying-" + shoptest.Random(4)
	sql.Register(name, lyingDriver{Driver: &mysql.MySQLDriver{}, lies: &o.lies})
	cfg, _ := mysql.ParseDSN(dsn)
	cfg.ClientFoundRows = true
	sqlDB, err := sql.Open(name, cfg.FormatDSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sqlDB.Close() })
	db, err := gorm.Open(gormmysql.New(gormmysql.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard, TranslateError: true})
	if err != nil {
		t.Fatal(err)
	}
	return db
}

// lie makes the next commit report a failure.
func (o *lyingOrders) lie() { o.lies.Store(1) }

func (o *lyingOrders) auditOK(t *testing.T, when string) {
	t.Helper()
	r, err := o.auditor.Audit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK {
		b, _ := json.Marshal(r)
		t.Fatalf("%s: audit %s", when, b)
	}
}

// payReportedFailed: a pay is reported failed, but landed; paying again
// debits nothing.
func (o *lyingOrders) payReportedFailed(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	awaiting, _, err := o.svc.Place(ctx, buyer, "k2", orderSKU, 1, false)
	if err != nil {
		t.Fatal(err)
	}
	o.lie()
	if _, err := o.svc.Pay(ctx, buyer, awaiting.ID); !errors.Is(err, mysql.ErrInvalidConn) {
		t.Fatalf("pay: %v; want the driver's error", err)
	}
	if p, err := o.svc.Pay(ctx, buyer, awaiting.ID); err != nil || p.Status != order.StatusPaid {
		t.Fatalf("pay again: %+v, %v", p, err)
	}
}

// closeReportedFailed: the closer's cancel of an expired order is
// reported failed, but landed; the next round closes nothing.
func (o *lyingOrders) closeReportedFailed(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	unpaid, _, err := o.svc.Place(ctx, buyer, "k3", orderSKU, 4, false)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(lyingPayTimeout + 50*time.Millisecond)
	o.lie()
	if n, err := o.svc.CloseExpired(ctx, slog.New(slog.DiscardHandler)); n != 0 || !errors.Is(err, mysql.ErrInvalidConn) {
		t.Fatalf("close: %d, %v; want 0 and the driver's error", n, err)
	}
	if n, err := o.svc.CloseExpired(ctx, slog.New(slog.DiscardHandler)); n != 0 || err != nil {
		t.Fatalf("next round: closed %d, %v; want nothing left", n, err)
	}
	if got, err := o.svc.Get(ctx, buyer, unpaid.ID); err != nil || got.Status != order.StatusCancelled {
		t.Fatalf("unpaid order: %+v, %v", got, err)
	}
}
