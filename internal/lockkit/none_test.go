package lockkit_test

import (
	"testing"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
)

// TestNoneLosesUpdates shows what the none backend is for: without a lock,
// concurrent read-modify-write cycles lose increments.
func TestNoneLosesUpdates(t *testing.T) {
	c := locktest.Contend(t, []lockkit.Locker{lockkit.None()}, "none:counter", 32, 5)
	if c.Lost == 0 || c.Overlaps == 0 {
		t.Fatalf("32 goroutines incremented without a lock: %+v; the baseline shows no damage", c)
	}
	t.Logf("without a lock: %d of %d increments lost, %d critical sections overlapped", c.Lost, 32*5, c.Overlaps)
}
