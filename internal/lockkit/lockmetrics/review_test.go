package lockmetrics_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/lockkit/lockmetrics"
)

// A lease that ran out before its holder released it counts as lost even
// if the holder never looked at Lost: the wrapper asks Lost at release
// time, with a select and a default.
func TestLostCountedWithoutAWatcher(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m := lockmetrics.New(reg, "local")
	inner := local.New()
	defer inner.Close()
	const leases = 10
	for i := range leases {
		lease, err := m.Wrap(inner).For(lockkey.Stock).Acquire(ctx, fmt.Sprintf("lock:stock:%d", i), lockkit.WithTTL(30*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(60 * time.Millisecond) // the TTL runs out; nobody watches
		_ = lease.Release(ctx)
	}
	if got := value(t, reg, "shop_lock_lost_total", map[string]string{"class": "stock"}); got != leases {
		t.Errorf("lost %v of %d leases released 30ms past their TTL, want all", got, leases)
	}
}
