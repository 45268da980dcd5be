package lockkey_test

import (
	"testing"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/idem"
	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/like"
	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/order"
)

// TestDomainKeysAreByteIdentical pins the keys the domains take, as they
// were before the classes were declared here. Do not update the wanted
// strings: a different key is a new fence counter (see the package doc).
func TestDomainKeysAreByteIdentical(t *testing.T) {
	for _, tc := range []struct {
		key   lockkey.Key
		want  string
		class lockkey.Class
	}{
		{account.Key(42), "lock:account:42", lockkey.Account},
		{account.Key(-1), "lock:account:-1", lockkey.Account},
		{inventory.Key("phone-x"), "lock:stock:phone-x", lockkey.Stock},
		{inventory.Key("lt_hot.2"), "lock:stock:lt_hot.2", lockkey.Stock},
		{like.Key(like.Ref{Type: "post", ID: "7"}), "lock:like:post:7", lockkey.Like},
		{order.Key(9), "lock:order:9", lockkey.Order},
		{order.LeaderKey, "lock:order-closer", lockkey.OrderCloser},
		{idem.PrunerKey, "lock:idem-pruner", lockkey.IdemPruner},
	} {
		if got := tc.key.String(); got != tc.want {
			t.Errorf("key %q, want %q", got, tc.want)
		}
		if got := tc.key.Class(); got != tc.class {
			t.Errorf("%s: class %q, want %q", tc.want, got, tc.class)
		}
	}
}
