package brokenrecipes

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/testenv"
)

// One release wakes every waiter of the parent-watch recipe, each of which
// lists the whole queue again, though only the first is granted: the herd.
// (lockbench's BenchmarkHerd counts the same beside the recipes that watch
// the node ahead, where a release wakes one.)
func TestParentWatchReleaseWakesEveryWaiter(t *testing.T) {
	addr := strings.Split(testenv.Require(t, "SHOP_TEST_ZK_ADDRS"), ",")[0]
	const waiters = 4
	root := fmt.Sprintf("/test/brokenrecipes/herd-%d", time.Now().UnixNano())
	dir := root + "/k"
	ctx := context.Background()

	holder := NewParentWatch(zkConn(t, addr, nil), root)
	defer holder.Close()
	lease, err := holder.TryAcquire(ctx, "k", lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	// A waiter's watch is armed once it has waited once more than it was
	// woken: every wake-up is followed by a listing that arms it again.
	woken, waited := make([]atomic.Int64, waiters), make([]atomic.Int64, waiters)
	armed := func(i int) bool { return waited[i].Load() == woken[i].Load()+1 }
	granted := make(chan int, waiters)
	for i := range waiters {
		wake := func(ev zk.Event) {
			if ev.Type == zk.EventNodeChildrenChanged && ev.Path == dir {
				woken[i].Add(1)
			}
		}
		l := NewParentWatch(zkConn(t, addr, wake), root)
		l.waiting = func() { waited[i].Add(1) }
		defer l.Close()
		go func() {
			lease, err := l.Acquire(ctx, "k", lockkit.WithTTL(time.Minute), lockkit.WithWaitTimeout(30*time.Second))
			if err != nil {
				t.Error(err)
				return
			}
			granted <- i
			_ = lease.Release(ctx)
		}()
		// Queued one after another: each newcomer wakes those before it.
		for j := range i + 1 {
			waitFor(t, fmt.Sprintf("waiter %d watching %s", j, dir), func() bool { return armed(j) })
		}
	}
	before := make([]int64, waiters)
	for i := range woken {
		before[i] = woken[i].Load()
	}

	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if first := <-granted; first != 0 {
		t.Fatalf("waiter %d was granted first, want waiter 0, which queued first", first)
	}
	for i := range woken {
		waitFor(t, fmt.Sprintf("waiter %d woken by the release", i), func() bool { return woken[i].Load() > before[i] })
	}
	for range waiters - 1 {
		<-granted
	}
}

func zkConn(t *testing.T, addr string, onEvent func(zk.Event)) *zk.Conn {
	if onEvent == nil {
		onEvent = func(zk.Event) {}
	}
	c, _, err := zk.Connect([]string{addr}, 10*time.Second, zk.WithLogInfo(false), zk.WithEventCallback(onEvent))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no %s within 10 s", what)
		}
	}
}
