package storage

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// TestSlowQueriesLogged: a statement over Options.SlowQuery is one WARN
// line with its SQL and duration, logged with the caller's context (so the
// service's handler adds the request id); under it, or with the log off,
// nothing.
func TestSlowQueriesLogged(t *testing.T) {
	for _, tc := range []struct {
		name string
		slow time.Duration
		want bool
	}{
		{"over-threshold", time.Nanosecond, true},
		{"under-threshold", time.Hour, false},
		{"off", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out strings.Builder
			db, err := Open(context.Background(), Options{
				SQLitePath: t.TempDir() + "/slow.db", SlowQuery: tc.slow,
				Log: slog.New(slog.NewTextHandler(&out, nil)),
			})
			if err != nil {
				t.Fatal(err)
			}
			defer db.Close()
			var n int
			if err := db.WithContext(context.Background()).Raw("SELECT 42").Scan(&n).Error; err != nil || n != 42 {
				t.Fatalf("SELECT 42: %d, %v", n, err)
			}
			logged := strings.Contains(out.String(), `level=WARN msg="slow query"`) && strings.Contains(out.String(), "SELECT 42")
			if logged != tc.want {
				t.Errorf("slow query logged %v, want %v:\n%s", logged, tc.want, out.String())
			}
		})
	}
}
