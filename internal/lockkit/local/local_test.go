package local_test

import (
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/lockkit/locktest"
)

func TestConformance(t *testing.T) {
	// One store shared by every client, as one process shares one Locker.
	var (
		store   = local.New()
		clients = func(testing.TB) lockkit.Locker { return sharedClient{store} }
	)
	locktest.Run(t, locktest.Harness{
		New:   clients,
		Steal: func(_ testing.TB, key string) { store.Steal(key) },
		TTL:   200 * time.Millisecond,
	})
}

// sharedClient hands the suite a view of one store whose Close does nothing,
// the way several goroutines of one process share a Locker.
type sharedClient struct{ *local.Locker }

func (sharedClient) Close() error { return nil }
