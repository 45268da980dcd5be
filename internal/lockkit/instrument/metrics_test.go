package instrument_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/instrument"
	"github.com/lockbench/shop/internal/lockkit/local"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestLabels: an acquisition is labelled with the class it names
// (lockkit.WithClass); the classes without a label of their own, and an
// acquisition that names none, are "other" (dashboards and alerts select
// on these values).
func TestLabels(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m := instrument.NewMetrics(reg, "local")
	inner := local.New()
	defer inner.Close()
	l := instrument.Wrap(inner, instrument.Options{Backend: "local", Metrics: m})
	for _, tc := range []struct {
		key   lockkey.Key
		opts  []lockkit.Option
		label string
	}{
		{lockkey.Account.Key("42"), []lockkit.Option{lockkit.WithClass("account")}, "account"},
		{lockkey.Stock.Key("phone-x"), []lockkit.Option{lockkit.WithClass("stock")}, "stock"},
		{lockkey.Like.Key("post", "7"), []lockkit.Option{lockkit.WithClass("like")}, "like"},
		{lockkey.Order.Key("9"), []lockkit.Option{lockkit.WithClass("order")}, "order"},
		{lockkey.OrderCloser.Key(), []lockkit.Option{lockkit.WithClass("order-closer")}, "other"},
		{lockkey.Account.Key("1"), nil, "other"},
	} {
		before := value(t, reg, "shop_lock_wait_seconds", map[string]string{"class": tc.label})
		if err := lockkit.Do(ctx, l, tc.key.String(), func(context.Context, uint64) error { return nil }, tc.opts...); err != nil {
			t.Fatal(err)
		}
		if got := value(t, reg, "shop_lock_wait_seconds", map[string]string{"class": tc.label}); got != before+1 {
			t.Errorf("%s: %v acquisitions labelled %q, want %v", tc.key, got, tc.label, before+1)
		}
	}
	m.Fenced(lockkey.OrderCloser)
	if got := value(t, reg, "shop_fenced_writes_total", map[string]string{"class": "other"}); got != 1 {
		t.Errorf("fenced other %v, want 1", got)
	}
}

// value sums the series of one family whose labels include want.
func value(t *testing.T, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			switch {
			case m.GetCounter() != nil:
				sum += m.GetCounter().GetValue()
			case m.GetHistogram() != nil:
				sum += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

func TestRecords(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m := instrument.NewMetrics(reg, "local")
	inner := local.New()
	defer inner.Close()
	l := instrument.Wrap(inner, instrument.Options{Backend: "local", Metrics: m})
	account := lockkit.WithClass("account")
	acct := map[string]string{"backend": "local", "class": "account"}

	lease, err := l.Acquire(ctx, "lock:account:1", account)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.TryAcquire(ctx, "lock:account:1", account); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("second holder: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := value(t, reg, "shop_lock_wait_seconds", acct); got != 1 {
		t.Errorf("wait observations %v, want 1", got)
	}
	if got := value(t, reg, "shop_lock_hold_seconds", acct); got != 1 {
		t.Errorf("hold observations %v, want 1", got)
	}
	if got := value(t, reg, "shop_lock_acquire_failures_total", map[string]string{"class": "account", "reason": "busy"}); got != 1 {
		t.Errorf("busy failures %v, want 1", got)
	}
	if got := value(t, reg, "shop_lock_lost_total", nil); got != 0 {
		t.Errorf("lost %v after a clean release, want 0", got)
	}

	// A lease that runs out before its holder releases it is lost.
	lease, err = l.Acquire(ctx, "lock:stock:x", lockkit.WithClass("stock"), lockkit.WithTTL(30*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	<-lease.Lost()
	_ = lease.Release(ctx)
	if got := value(t, reg, "shop_lock_lost_total", map[string]string{"class": "stock"}); got != 1 {
		t.Errorf("lost %v, want 1", got)
	}

	m.Fenced(lockkey.Account)
	if got := value(t, reg, "shop_fenced_writes_total", acct); got != 1 {
		t.Errorf("fenced %v, want 1", got)
	}
}

// A lease that ran out before its holder released it counts as lost even
// if the holder never looked at Lost: the wrapper asks Lost at release
// time, with a select and a default.
func TestLostCountedWithoutAWatcher(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m := instrument.NewMetrics(reg, "local")
	inner := local.New()
	defer inner.Close()
	const leases = 10
	for i := range leases {
		lease, err := instrument.Wrap(inner, instrument.Options{Backend: "local", Metrics: m}).Acquire(ctx, fmt.Sprintf("lock:stock:%d", i), lockkit.WithClass("stock"), lockkit.WithTTL(30*time.Millisecond))
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
