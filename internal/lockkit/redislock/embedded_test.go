package redislock_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// `make run` puts this backend on miniredis (cmd/shop/app.go), whose Lua is
// gopher-lua: the scripts must run there too, with exact tokens.
func TestScriptsRunOnEmbeddedServer(t *testing.T) {
	m := miniredis.RunT(t)
	client := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer client.Close()
	l := newLocker(t, client)
	ctx := context.Background()
	var last uint64
	for range 3 {
		lease := hold(t, l, "embedded")
		if lease.Fence() <= last || lease.Fence() < uint64(time.Now().Add(-time.Hour).UnixMicro()) {
			t.Errorf("token %d after %d", lease.Fence(), last)
		}
		last = lease.Fence()
		waiter := acquireAsync(l, ctx, "embedded")
		time.Sleep(20 * time.Millisecond)
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		got := <-waiter
		if got.err != nil {
			t.Fatal(got.err)
		}
		if got.lease.Fence() <= last {
			t.Errorf("waiter's token %d after %d", got.lease.Fence(), last)
		}
		last = got.lease.Fence()
		_ = got.lease.Release(ctx)
	}
}
