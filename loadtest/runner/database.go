package main

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"github.com/go-sql-driver/mysql"
)

// mariadb is the test servers' MariaDB (SHOP_TEST_MYSQL_DSN), where every
// row gets a database of its own: fences start at 0 and no row of another
// backend's run (whose fences came from another counter) can refuse this
// run's writes.
type mariadb struct {
	cfg *mysql.Config
}

// rowDB is one row's database on the server.
type rowDB struct {
	name, dsn string
}

func (d rowDB) open() (*sql.DB, error) { return sql.Open("mysql", d.dsn) }

// admin is a connection to the server with no database chosen: the one
// the runner creates and drops the rows' databases through.
func (m mariadb) admin() (*sql.DB, error) {
	cfg := m.cfg.Clone()
	cfg.DBName = ""
	return sql.Open("mysql", cfg.FormatDSN())
}

// create makes database name afresh, dropping an earlier one of that name.
func (m mariadb) create(ctx context.Context, name string) (rowDB, error) {
	db, err := m.admin()
	if err != nil {
		return rowDB{}, err
	}
	defer db.Close()
	// name is built from [a-z0-9_] only (dbName), so quoting is enough.
	if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
		return rowDB{}, fmt.Errorf("drop database %s: %w", name, err)
	}
	if _, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"`"); err != nil {
		return rowDB{}, fmt.Errorf("create database %s: %w", name, err)
	}
	cfg := m.cfg.Clone()
	cfg.DBName = name
	return rowDB{name: name, dsn: cfg.FormatDSN()}, nil
}

func (m mariadb) drop(ctx context.Context, names ...string) error {
	db, err := m.admin()
	if err != nil {
		return err
	}
	defer db.Close()
	for _, name := range names {
		if _, err := db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`"); err != nil {
			return err
		}
	}
	return nil
}

// sweep drops the databases of earlier runs whose runner is gone (killed
// before it could drop them), so that interrupted runs do not pile up on a
// server others use. A live runner's databases are left alone.
func (m mariadb) sweep(ctx context.Context) error {
	db, err := m.admin()
	if err != nil {
		return err
	}
	names, err := column[string](ctx, db, `SHOW DATABASES LIKE 'shop\_lt\_%'`)
	db.Close()
	if err != nil {
		return err
	}
	var stale []string
	for _, name := range names {
		pid, _, _ := strings.Cut(strings.TrimPrefix(name, "shop_lt_"), "_")
		if n, err := strconv.Atoi(pid); err == nil && n != os.Getpid() && !alive(n) {
			stale = append(stale, name)
		}
	}
	return m.drop(ctx, stale...)
}

// alive reports whether a process pid exists (signal 0 checks, sends
// nothing).
func alive(pid int) bool {
	p, err := os.FindProcess(pid)
	return err == nil && p.Signal(syscall.Signal(0)) == nil
}

// runID names this run in its databases and key prefixes: the runner's
// pid, which sweep reads back to tell a live run's databases from a dead
// one's.
func runID() string { return strconv.Itoa(os.Getpid()) }

func dbName(runID, row string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(row) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteRune('_')
		}
	}
	return "shop_lt_" + runID + "_" + b.String()
}
