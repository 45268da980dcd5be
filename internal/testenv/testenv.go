// Package testenv gives tests the servers that scripts/testenv.sh starts,
// named by SHOP_TEST_* variables (docs/testing.md). It holds the one rule
// every such test follows: without its server a test is skipped on a
// developer's machine, and fails in CI (CI=true), where nothing may skip.
package testenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Require returns the variable's value, or skips t (fails it in CI) when
// the variable is unset.
func Require(t testing.TB, name string) string {
	t.Helper()
	const how = "make test starts the servers; by hand: scripts/testenv.sh up, then source /tmp/shop-testenv/env"
	v := os.Getenv(name)
	if v == "" {
		Missing(t, "%s is not set: this test needs a real server (%s)", name, how)
	}
	return v
}

// Missing reports that something the test needs is not there (a server, a
// replica, a tool): it skips t on a developer's machine and fails it in CI.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format+" (CI=true: not skipping)", args...)
		return
	}
	t.Skipf(format, args...)
}

// RequireList is Require for a comma-separated list of addresses.
func RequireList(t testing.TB, name string) []string {
	t.Helper()
	return strings.Split(Require(t, name), ",")
}

// MeasureOut is the file a measurement appends its table to,
// SHOP_MEASURE_OUT (make events-bench). Without it the measurement skips
// on a developer's machine; in CI it runs all the same, into a file of
// its own that nobody reads, so that its code is checked on every run.
func MeasureOut(t testing.TB) string {
	t.Helper()
	if path := os.Getenv("SHOP_MEASURE_OUT"); path != "" {
		return path
	}
	if os.Getenv("CI") != "true" {
		t.Skip("a measurement: make events-bench runs it (SHOP_MEASURE_OUT)")
	}
	return filepath.Join(t.TempDir(), "measure.md")
}
