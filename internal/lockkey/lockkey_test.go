package lockkey_test

import (
	"testing"

	"github.com/lockbench/shop/internal/lockkey"
)

// TestKeysAreByteIdentical pins every key scheme as it is in production.
// A failure here is not a test to update: a changed key restarts its
// fencing counter, and the stores then refuse every write (see the
// package doc). Change a key only with a migration of the fences.
func TestKeysAreByteIdentical(t *testing.T) {
	for _, tc := range []struct {
		key   lockkey.Key
		want  string
		class lockkey.Class
	}{
		{lockkey.Account.Key("42"), "lock:account:42", "account"},
		{lockkey.Stock.Key("phone-x"), "lock:stock:phone-x", "stock"},
		{lockkey.Like.Key("post", "7"), "lock:like:post:7", "like"},
		{lockkey.Order.Key("9"), "lock:order:9", "order"},
		{lockkey.OrderCloser.Key(), "lock:order-closer", "order-closer"},
		{lockkey.EventRelay.Key(), "lock:event-relay", "event-relay"},
		{lockkey.IdemPruner.Key(), "lock:idem-pruner", "idem-pruner"},
	} {
		if got := tc.key.String(); got != tc.want {
			t.Errorf("key %q, want %q", got, tc.want)
		}
		if got := tc.key.Class(); got != tc.class {
			t.Errorf("%s: class %q, want %q", tc.want, got, tc.class)
		}
	}
}

func TestStrings(t *testing.T) {
	got := lockkey.Strings([]lockkey.Key{lockkey.Stock.Key("a"), lockkey.Account.Key("1")})
	if len(got) != 2 || got[0] != "lock:stock:a" || got[1] != "lock:account:1" {
		t.Fatalf("Strings = %q", got)
	}
}
