package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestCommandLine: help and wrong arguments are answered before anything
// runs or any configuration is read; exit 2 is a usage or configuration
// error, as for the rest of the command line.
func TestCommandLine(t *testing.T) {
	db := filepath.Join(t.TempDir(), "shop.db")
	dev := map[string]string{"SHOP_ENV": "dev", "SHOP_SQLITE_PATH": db, "SHOP_HTTP_ADDR": "127.0.0.1:0"}
	broken := map[string]string{"SHOP_LOCK_BACKEND": "nope"}
	for _, tc := range []struct {
		name   string
		args   []string
		env    map[string]string
		code   int
		stdout string // must occur in stdout
		stderr string // must occur in stderr
		// notErr must not occur in stderr: an argument error is reported
		// before the configuration is read.
		notErr string
	}{
		{name: "no-args", code: 2, stderr: "usage:"},
		{name: "help", args: []string{"--help"}, env: broken, code: 0, stdout: "shop serve"},
		{name: "help-command", args: []string{"help", "migrate"}, env: broken, code: 0, stdout: "usage: shop migrate"},
		{name: "serve-help", args: []string{"serve", "--help"}, env: dev, code: 0, stdout: "usage: shop serve"},
		{name: "serve-h-broken-config", args: []string{"serve", "-h"}, env: broken, code: 0, stdout: "usage: shop serve"},
		{name: "migrate-help", args: []string{"migrate", "--help"}, env: dev, code: 0, stdout: "usage: shop migrate"},
		{name: "token-help", args: []string{"token", "-help"}, env: broken, code: 0, stdout: "usage: shop token"},
		{name: "serve-extra-arg", args: []string{"serve", "now"}, env: dev, code: 2, stderr: `unexpected argument "now"`},
		{name: "migrate-flag", args: []string{"migrate", "-ttl", "1h"}, env: dev, code: 2, stderr: "flag provided but not defined: -ttl"},
		{name: "migrate-unknown-flag", args: []string{"migrate", "--dry-run"}, env: dev, code: 2, stderr: "dry-run"},
		{name: "unknown-command", args: []string{"start"}, env: dev, code: 2, stderr: `unknown command "start"`},
		{name: "version", args: []string{"version"}, env: broken, code: 0, stdout: "shop "},
		{name: "version-extra", args: []string{"version", "now"}, env: broken, code: 2, stderr: "unexpected argument"},
		{name: "healthcheck-extra", args: []string{"healthcheck", "x"}, code: 2, stderr: "unexpected argument"},
		{name: "token", args: []string{"token", "1", "-ttl", "1h"}, env: dev, code: 0, stdout: "."},
		{name: "token-flag-first", args: []string{"token", "-ttl", "1h", "1"}, env: dev, code: 0, stdout: "."},
		{name: "token-no-user", args: []string{"token"}, env: dev, code: 2, stderr: "missing the user id"},
		{name: "token-two-users", args: []string{"token", "1", "2"}, env: dev, code: 2, stderr: `unexpected argument "2"`},
		{name: "token-extra-args-in-order", args: []string{"token", "1", "extra", "more"}, env: dev, code: 2,
			stderr: `unexpected arguments ["extra" "more"]`},
		{name: "token-bad-user", args: []string{"token", "alice"}, env: dev, code: 2, stderr: `user id "alice" is not a number`},
		{name: "token-zero-user", args: []string{"token", "0"}, env: dev, code: 2, stderr: `user id "0" is not a positive`},
		{name: "token-bad-ttl", args: []string{"token", "1", "-ttl", "-1h"}, env: dev, code: 2, stderr: "-ttl must be positive"},
		{name: "token-over-the-max-ttl", args: []string{"token", "1", "-ttl", "25h"}, env: dev, code: 1, stderr: "SHOP_JWT_MAX_TTL"},
		{name: "token-args-before-secrets", args: []string{"token", "alice"}, code: 2, stderr: "not a number", notErr: "SHOP_JWT_SECRET is required"},
		{name: "token-missing-before-secrets", args: []string{"token"}, code: 2, stderr: "missing the user id", notErr: "SHOP_JWT_SECRET is required"},
		{name: "token-after-double-dash", args: []string{"token", "-ttl", "1h", "--", "1"}, env: dev, code: 0, stdout: "."},
		{name: "ceiling-is-not-a-service-command", args: []string{"ceiling"}, env: dev, code: 2, stderr: `unknown command "ceiling"`},
		{name: "port-out-of-range", args: []string{"serve"}, env: map[string]string{"SHOP_ENV": "dev", "SHOP_HTTP_ADDR": ":99999"},
			code: 2, stderr: "SHOP_HTTP_ADDR"},
		{name: "production-by-default", args: []string{"serve"}, code: 2, stderr: "SHOP_JWT_SECRET is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			done := make(chan int, 1)
			go func() { done <- run(tc.args, func(k string) string { return tc.env[k] }, &stdout, &stderr) }()
			var code int
			select {
			case code = <-done:
			case <-time.After(30 * time.Second):
				t.Fatalf("shop %v is still running: it should have answered and exited", tc.args)
			}
			if code != tc.code || !strings.Contains(stdout.String(), tc.stdout) || !strings.Contains(stderr.String(), tc.stderr) ||
				tc.notErr != "" && strings.Contains(stderr.String(), tc.notErr) {
				t.Errorf("shop %v: exit %d, want %d\nstdout: %s\nstderr: %s", tc.args, code, tc.code, stdout.String(), stderr.String())
			}
		})
	}
	if _, err := os.Stat(db); !os.IsNotExist(err) {
		t.Errorf("a help or a refused command created the database %s (%v)", db, err)
	}
}
