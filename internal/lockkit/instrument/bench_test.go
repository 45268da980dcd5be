package instrument_test

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/instrument"
	"github.com/lockbench/shop/internal/lockkit/local"
)

// BenchmarkCycle is one acquire and release of a free key over the
// in-process backend, bare and through the wrapper: what admission,
// metrics and tracing (the global tracer provider: a no-op unless a test
// installs one) add to every grant. Allocations per cycle are the figure
// to compare; time depends on the machine.
//
//	go test -run '^$' -bench Cycle -benchmem ./internal/lockkit/instrument
func BenchmarkCycle(b *testing.B) {
	backend := local.New()
	defer backend.Close()
	wrapped := instrument.Wrap(backend, instrument.Options{Backend: "local",
		Metrics: instrument.NewMetrics(prometheus.NewRegistry(), "local"), MaxWaiters: 64})
	for _, tc := range []struct {
		name string
		l    lockkit.Locker
	}{{"bare", backend}, {"wrapped", wrapped}} {
		b.Run(tc.name, func(b *testing.B) {
			ctx, class := context.Background(), lockkit.WithClass("stock")
			b.ReportAllocs()
			for b.Loop() {
				lease, err := tc.l.Acquire(ctx, "lock:stock:k", class)
				if err != nil {
					b.Fatal(err)
				}
				_ = lease.Release(ctx)
			}
		})
	}
}
