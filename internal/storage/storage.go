// Package storage opens shop's SQL database through gorm, MySQL/MariaDB or
// SQLite, and migrates the schema the domain packages declare.
package storage

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/glebarez/sqlite"
	driver "github.com/go-sql-driver/mysql"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// DefaultReadTimeout bounds every wait for a MySQL reply when the DSN
// sets no readTimeout of its own.
const DefaultReadTimeout = 30 * time.Second

// Options says which database to open.
type Options struct {
	// MySQLDSN selects MySQL/MariaDB when set (go-sql-driver format).
	MySQLDSN string
	// SQLitePath is the SQLite file when MySQLDSN is empty; empty is a new
	// file in a temporary directory that Close removes.
	SQLitePath string
	// MaxConns bounds the MySQL pool. SQLite always uses one connection.
	MaxConns int
	// SlowQuery, when above 0, logs every statement that takes longer at
	// WARN on Log (slog.Default() when nil).
	SlowQuery time.Duration
	Log       *slog.Logger
}

// DB is an open database.
type DB struct {
	*gorm.DB
	// Dialect is "mysql" or "sqlite", for the few statements that differ.
	Dialect string
	tempDir string
}

// Open connects and checks the connection. The caller closes the DB.
func Open(ctx context.Context, o Options) (*DB, error) {
	db := &DB{}
	dial, err := db.dialector(o)
	if err != nil {
		return nil, err
	}
	g, err := gorm.Open(dial, &gorm.Config{Logger: gormLogger(o), TranslateError: true})
	if err != nil {
		db.removeTemp()
		return nil, fmt.Errorf("storage: open %s: %w", db.Dialect, err)
	}
	db.DB = g
	sqlDB, err := g.DB()
	if err != nil {
		db.Close()
		return nil, err
	}
	db.sizePool(sqlDB, o.MaxConns)
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := sqlDB.PingContext(pctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("storage: ping %s: %w", db.Dialect, err)
	}
	return db, nil
}

// gormLogger is gorm's logger for o: gorm's own prints to stdout, and shop
// logs through slog, only the slow statements.
func gormLogger(o Options) logger.Interface {
	if o.SlowQuery > 0 {
		return slowLog{log: cmp.Or(o.Log, slog.Default()), threshold: o.SlowQuery}
	}
	return logger.Discard
}

// slowLog is gorm's logger reduced to what shop wants from it: statements
// slower than a threshold, at WARN, through slog and with the caller's
// context (so a request's id follows). Errors are not logged here: they
// are returned, and whoever handles one logs it once, with its meaning.
type slowLog struct {
	log       *slog.Logger
	threshold time.Duration
}

func (l slowLog) LogMode(logger.LogLevel) logger.Interface { return l }

func (slowLog) Info(context.Context, string, ...any)  {}
func (slowLog) Warn(context.Context, string, ...any)  {}
func (slowLog) Error(context.Context, string, ...any) {}

func (l slowLog) Trace(ctx context.Context, begin time.Time, fc func() (string, int64), _ error) {
	elapsed := time.Since(begin)
	if elapsed < l.threshold {
		return
	}
	sql, rows := fc()
	l.log.WarnContext(ctx, "slow query", "sql", sql, "rows", rows,
		"duration_ms", float64(elapsed.Microseconds())/1000, "threshold_ms", l.threshold.Milliseconds())
}

// dialector is the driver of the database o names; it sets db's Dialect,
// and its tempDir when SQLite gets a file of its own.
func (db *DB) dialector(o Options) (gorm.Dialector, error) {
	if o.MySQLDSN != "" {
		db.Dialect = "mysql"
		dsn, err := mysqlDSN(o.MySQLDSN)
		if err != nil {
			return nil, err
		}
		return mysql.Open(dsn), nil
	}
	db.Dialect = "sqlite"
	path := o.SQLitePath
	if path == "" {
		dir, err := os.MkdirTemp("", "shop-sqlite-")
		if err != nil {
			return nil, err
		}
		db.tempDir = dir
		path = filepath.Join(dir, "shop.db")
	}
	// busy_timeout makes a second process wait for the write lock instead
	// of failing at once; WAL lets readers run while one writes.
	return sqlite.Open("file:" + path + "?_pragma=busy_timeout(5000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)"), nil
}

// mysqlDSN is dsn with the driver settings shop's statements rely on.
func mysqlDSN(dsn string) (string, error) {
	cfg, err := driver.ParseDSN(dsn)
	if err != nil {
		return "", fmt.Errorf("storage: %w", err)
	}
	// parseTime: DATETIME columns scan into time.Time. clientFoundRows:
	// RowsAffected counts the rows the WHERE matched, not those whose
	// values changed; an unfenced write of the value a row already has
	// is still a write, and 0 would read as "refused".
	cfg.ParseTime, cfg.ClientFoundRows = true, true
	// interpolateParams: a statement with arguments is one round trip
	// instead of three packets (prepare, execute, close) and two waits.
	// Inside a critical section every round trip is paid by each buyer
	// queued behind it. The driver refuses to interpolate under a
	// charset where escaping is unsafe, so this cannot open an injection.
	cfg.InterpolateParams = true
	// A reply that never comes (a connection dropped without a reset)
	// would block its caller for ever; a COMMIT so blocked also keeps
	// the request's lock, renewed by its watchdog. The driver honours no
	// context during COMMIT, so only a read deadline ends it: the
	// request then gets ErrInvalidConn, answered outcome-unknown.
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	return cfg.FormatDSN(), nil
}

// sizePool sizes the connection pool for db's dialect.
func (db *DB) sizePool(sqlDB *sql.DB, maxConns int) {
	if db.Dialect == "sqlite" {
		// SQLite has one writer per file. One connection queues writers in
		// the pool rather than in SQLITE_BUSY retries, and a transaction
		// never meets another of this process half-way.
		sqlDB.SetMaxOpenConns(1)
		return
	}
	sqlDB.SetMaxOpenConns(max(maxConns, 1))
	sqlDB.SetMaxIdleConns(max(maxConns, 1))
	sqlDB.SetConnMaxLifetime(5 * time.Minute)
}

// Ping checks that the database answers.
func (db *DB) Ping(ctx context.Context) error {
	sqlDB, err := db.DB.DB()
	if err != nil {
		return err
	}
	return sqlDB.PingContext(ctx)
}

// Close closes the pool and removes a temporary SQLite file.
func (db *DB) Close() error {
	var err error
	if db.DB != nil {
		if sqlDB, e := db.DB.DB(); e == nil {
			err = sqlDB.Close()
		}
	}
	db.removeTemp()
	return err
}

func (db *DB) removeTemp() {
	if db.tempDir != "" {
		_ = os.RemoveAll(db.tempDir)
	}
}

// Migrate creates or extends the tables of models (gorm AutoMigrate: it adds
// tables, columns and indexes, and never drops or narrows one, so an older
// binary keeps working on a newer schema during a rolling deploy).
//
// Several instances may start at once against one MySQL; a named lock
// (GET_LOCK) makes them migrate one after the other, because two concurrent
// CREATE TABLEs of the same table fail in the second.
func (db *DB) Migrate(ctx context.Context, models ...any) error {
	if db.Dialect != "mysql" {
		return db.WithContext(ctx).AutoMigrate(models...)
	}
	// GET_LOCK belongs to a session: hold one connection for the whole run.
	return db.WithContext(ctx).Connection(func(tx *gorm.DB) error {
		var got int
		if err := tx.Raw("SELECT GET_LOCK('shop_migrate', 60)").Scan(&got).Error; err != nil {
			return fmt.Errorf("storage: migrate lock: %w", err)
		}
		if got != 1 {
			return errors.New("storage: another instance has been migrating for 60s")
		}
		defer tx.Exec("SELECT RELEASE_LOCK('shop_migrate')")
		if err := tx.Set("gorm:table_options", "DEFAULT CHARSET=utf8mb4 COLLATE="+binaryCollation).AutoMigrate(models...); err != nil {
			return err
		}
		return convertToBinary(tx, models)
	})
}

// binaryCollation is every shop table's on MySQL. The identifiers in them
// (SKUs, idempotency keys) are also spelled into lock keys and Redis keys,
// which compare byte for byte, as SQLite does. Under MariaDB's default
// (utf8mb4_general_ci) PHONE-X and phone-x would be one row under two lock
// keys, each lock admitting its own holder to the same row.
const binaryCollation = "utf8mb4_bin"

// convertToBinary converts the tables of models that an earlier version
// created under another collation. A binary unique index is looser than a
// case-insensitive one, so the rows already there always fit.
func convertToBinary(tx *gorm.DB, models []any) error {
	for _, m := range models {
		stmt := &gorm.Statement{DB: tx}
		if err := stmt.Parse(m); err != nil {
			return err
		}
		table := stmt.Schema.Table
		var collation string
		err := tx.Raw("SELECT table_collation FROM information_schema.tables WHERE table_schema = DATABASE() AND table_name = ?",
			table).Scan(&collation).Error
		if err != nil {
			return err
		}
		if collation == binaryCollation {
			continue
		}
		if err := tx.Exec("ALTER TABLE " + tx.Statement.Quote(table) + " CONVERT TO CHARACTER SET utf8mb4 COLLATE " + binaryCollation).Error; err != nil {
			return fmt.Errorf("storage: convert %s to %s: %w", table, binaryCollation, err)
		}
	}
	return nil
}

type txKey struct{}

// InTx returns ctx carrying tx. A store that takes its handle through Conn
// then joins tx instead of committing on its own, so that the writes of
// several stores commit together or not at all (the admin reset: a change
// committed between two domains' resets would keep its rows in one and lose
// them in the other).
func InTx(ctx context.Context, tx *gorm.DB) context.Context {
	return context.WithValue(ctx, txKey{}, tx)
}

// Conn returns the transaction ctx carries (InTx), or else db bound to ctx.
func Conn(ctx context.Context, db *gorm.DB) *gorm.DB {
	if tx, ok := ctx.Value(txKey{}).(*gorm.DB); ok {
		return tx.WithContext(ctx)
	}
	return db.WithContext(ctx)
}
