package main

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/config"
)

// TestNewAppFailureClosesWhatItOpened: a step that fails after the
// database and the embedded Redis are open (here the lock backend, which
// SQLite cannot hold) makes newApp return its error, having closed both;
// it must not crash on the way out.
func TestNewAppFailureClosesWhatItOpened(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	vars := map[string]string{
		"SHOP_ENV": "production", "SHOP_JWT_SECRET": testSecret, "SHOP_ADMIN_TOKEN": testAdmin,
		"SHOP_SQLITE_PATH": filepath.Join(t.TempDir(), "shop.db"),
	}
	cfg, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	// Past config's own check, so that the failure comes from openLocker.
	cfg.LockBackend = "mysql"
	a, err := newApp(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err == nil || !strings.Contains(err.Error(), "needs SHOP_MYSQL_DSN") || a != nil {
		t.Fatalf("newApp = %v, %v; want no app and openLocker's error", a, err)
	}
}
