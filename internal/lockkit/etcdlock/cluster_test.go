package etcdlock

import (
	"testing"

	"github.com/lockbench/shop/internal/testenv"
)

// The conformance suite against a 3-member cluster: every grant is a
// quorum write, and the client spreads its calls over the members.
func TestConformanceOnCluster(t *testing.T) {
	runConformance(t, testenv.RequireList(t, "SHOP_TEST_ETCD_CLUSTER_ENDPOINTS"))
}
