package lockkit_test

import (
	"testing"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/locktest"
)

// TestNoneLosesUpdates shows what the none backend is for: without a lock,
// concurrent read-modify-write cycles lose increments.
func TestNoneLosesUpdates(t *testing.T) {
	lost := locktest.CountLostUpdates(t, []lockkit.Locker{lockkit.None()}, "none:counter", 32, 5)
	if lost == 0 {
		t.Fatal("32 goroutines incremented without a lock and lost nothing; the baseline shows no damage")
	}
	t.Logf("lost %d of %d increments without a lock", lost, 32*5)
}
