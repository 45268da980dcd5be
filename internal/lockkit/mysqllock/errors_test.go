package mysqllock

import (
	"context"
	"database/sql/driver"
	"errors"
	"net"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/lockbench/shop/internal/lockkit"
)

func TestUnavailableClassifiesErrors(t *testing.T) {
	for _, tc := range []struct {
		name        string
		err         error
		unavailable bool
	}{
		{"bad-conn", driver.ErrBadConn, true},
		{"invalid-conn", mysql.ErrInvalidConn, true},
		{"refused", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, true},
		{"too-many-connections", &mysql.MySQLError{Number: 1040}, true},
		{"read-only-failover", &mysql.MySQLError{Number: 1290}, true},
		{"connection-killed", &mysql.MySQLError{Number: 1927}, true},
		{"syntax", &mysql.MySQLError{Number: 1064}, false},
		{"no-such-table", &mysql.MySQLError{Number: 1146}, false},
		{"caller-cancelled", context.Canceled, false},
		{"caller-deadline", context.DeadlineExceeded, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := unavailable(tc.err)
			if got := errors.Is(err, lockkit.ErrUnavailable); got != tc.unavailable {
				t.Fatalf("unavailable(%v) is ErrUnavailable: %v, want %v", tc.err, got, tc.unavailable)
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("unavailable(%v) = %v lost the cause", tc.err, err)
			}
		})
	}
}
