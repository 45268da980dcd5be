package redislock_test

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// A fence counter that goes back (a restart without persistence, a
// failover to a replica that missed the last increments, eviction) must
// not make a later grant's token lower than an earlier one's: the stores
// would then refuse the new holder for good, or let a stale one through.
func TestFenceAboveEveryEarlierAfterCounterLoss(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	l := newLocker(t, admin)
	ctx := context.Background()
	key := uniqueKey(t)
	counter := "{" + testPrefix + key + "}:fence"
	var last uint64
	for _, loss := range []func(){
		func() {},
		func() { admin.Del(ctx, counter) },       // restart without persistence, eviction
		func() { admin.Set(ctx, counter, 1, 0) }, // a replica that missed increments
		func() {},
		// A counter ahead of the clock: tokens go on from it, every
		// digit kept up to 2^53.
		func() { admin.Set(ctx, counter, "9007199254740000", 0) },
		func() {},
	} {
		loss()
		lease := hold(t, l, key)
		if lease.Fence() <= last {
			t.Errorf("token %d after %d", lease.Fence(), last)
		}
		if stored := admin.Get(ctx, counter).Val(); stored != strconv.FormatUint(lease.Fence(), 10) {
			t.Errorf("token %d, counter %q", lease.Fence(), stored)
		}
		last = lease.Fence()
		_ = lease.Release(ctx)
		time.Sleep(time.Millisecond)
	}
}
