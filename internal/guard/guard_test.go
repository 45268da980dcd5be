package guard_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/instrument"
	"github.com/lockbench/shop/internal/lockkit/local"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// count sums the samples of one metric family whose class label is class.
func count(t *testing.T, reg *prometheus.Registry, name, class string) float64 {
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
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "class" && lp.GetValue() == class {
					sum += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
				}
			}
		}
	}
	return sum
}

// TestDoLabelsEachKeyByItsClass: a flow over keys of several classes (an
// order placed and paid locks stock and account) is measured per key, each
// under its own class, and hands each key's token to the flow; a read
// under the same keys (Hold) is labelled the same way.
func TestDoLabelsEachKeyByItsClass(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m := instrument.NewMetrics(reg, "local")
	inner := local.New()
	defer inner.Close()
	wrapped := instrument.Wrap(inner, instrument.Options{Backend: "local", Metrics: m})
	g := guard.New(lockkey.Order, guard.Locking{Locker: wrapped, Metrics: m})

	stock, acct := lockkey.Stock.Key("x"), lockkey.Account.Key("1")
	err := g.Do(ctx, []lockkey.Key{stock, acct}, func(_ context.Context, f guard.Fences) error {
		if f.Of(stock) == 0 || f.Of(acct) == 0 {
			return fmt.Errorf("fences %v: want a token for each key", f)
		}
		if f.Of(lockkey.Order.Key("1")) != 0 {
			return errors.New("a token for a key the flow does not hold")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Hold(ctx, []lockkey.Key{stock, acct}, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
	for _, class := range []string{"stock", "account"} {
		if got := count(t, reg, "shop_lock_wait_seconds", class); got != 2 {
			t.Errorf("%s acquisitions %v, want 2", class, got)
		}
	}
	if got := count(t, reg, "shop_lock_wait_seconds", "other"); got != 0 {
		t.Errorf("%v acquisitions labelled other, want 0", got)
	}
}

// TestDoCountsFencedWritesUnderTheGuardsClass: a write a fence refused is
// counted once, under the class the guard was made for, whatever keys the
// flow held; other errors are not counted.
func TestDoCountsFencedWritesUnderTheGuardsClass(t *testing.T) {
	ctx := context.Background()
	reg := prometheus.NewRegistry()
	m := instrument.NewMetrics(reg, "local")
	inner := local.New()
	defer inner.Close()
	wrapped := instrument.Wrap(inner, instrument.Options{Backend: "local", Metrics: m})
	g := guard.New(lockkey.Order, guard.Locking{Locker: wrapped, Metrics: m})
	keys := []lockkey.Key{lockkey.Order.Key("1"), lockkey.Stock.Key("x")}

	refused := fmt.Errorf("order 1: %w", lockkit.ErrFenced)
	if err := g.Do(ctx, keys, func(context.Context, guard.Fences) error { return refused }); !errors.Is(err, lockkit.ErrFenced) {
		t.Fatalf("Do = %v, want ErrFenced", err)
	}
	other := errors.New("sold out")
	if err := g.Do(ctx, keys, func(context.Context, guard.Fences) error { return other }); err != other {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	if got := count(t, reg, "shop_fenced_writes_total", "order"); got != 1 {
		t.Errorf("fenced writes of class order %v, want 1", got)
	}
}

// TestWithoutMetricsOrLocker: a guard over a backend used directly (as
// the domain tests do), without metrics, takes the keys and hands their
// tokens on; a nil Locker is the unsafe baseline, every token 0.
func TestWithoutMetricsOrLocker(t *testing.T) {
	ctx := context.Background()
	inner := local.New()
	defer inner.Close()
	k := lockkey.Account.Key("1")
	for name, g := range map[string]*guard.Guard{
		"plain": guard.New(lockkey.Account, guard.Locking{Locker: inner}),
		"none":  guard.New(lockkey.Account, guard.Locking{}),
	} {
		var fence uint64
		err := g.Do(ctx, []lockkey.Key{k}, func(_ context.Context, f guard.Fences) error {
			fence = f.Of(k)
			return fmt.Errorf("refused: %w", lockkit.ErrFenced) // no metrics: counts nothing, panics nowhere
		})
		if !errors.Is(err, lockkit.ErrFenced) {
			t.Errorf("%s: Do = %v", name, err)
		}
		if (fence == 0) != (name == "none") {
			t.Errorf("%s: fence %d", name, fence)
		}
		if err := g.Hold(ctx, []lockkey.Key{k}, func(context.Context) error { return nil }); err != nil {
			t.Errorf("%s: Hold = %v", name, err)
		}
	}
}

func TestWork(t *testing.T) {
	if err := guard.Work(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if err := guard.Work(context.Background(), time.Millisecond); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	cancel(lockkit.ErrLeaseLost)
	if err := guard.Work(ctx, time.Hour); !errors.Is(err, lockkit.ErrLeaseLost) {
		t.Fatalf("Work after the lease was lost = %v, want its cause", err)
	}
}
