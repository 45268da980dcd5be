package zklock

import (
	"testing"

	"github.com/lockbench/shop/internal/testenv"
)

// The conformance suite against a 3-member ensemble: every create and
// delete is a quorum write, and each client's session lives on one
// member, chosen at random.
func TestConformanceOnEnsemble(t *testing.T) {
	runConformance(t, testenv.RequireList(t, "SHOP_TEST_ZK_ENSEMBLE_ADDRS"))
}
