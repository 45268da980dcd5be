// Package linetest proves, against a real store, what a Locker that waits
// with a backend.Line promises: exact mutual exclusion and no lost wake-up
// while waiters give up at random, a waiter that gives up leaves the line,
// Close ends every waiter, one poller per Locker and key, and a busy line
// in one Locker does not starve a waiter in another.
//
// A backend's test calls Run with a Harness, as it calls locktest.Run.
package linetest

import (
	"context"
	"crypto/rand"
	"errors"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
	"github.com/lockbench/shop/internal/lockkit/locktest"
)

// Harness opens Lockers of the backend under test; Run closes them.
type Harness struct {
	// New opens a Locker with its own connections, as another process
	// would.
	New func(t testing.TB) lockkit.Locker
	// Wired opens one like New whose connections pass through w.
	Wired func(t testing.TB, w *locktest.Wire) lockkit.Locker
}

// lease is long: a lost wake-up then shows as a waiter stuck behind a
// released key, not as a short delay until the lease expires.
const leaseTTL = time.Minute

// stuck is how long a waiter that should be served may wait before the
// test calls it stuck: a correctness bound, not a speed claim.
const stuck = 20 * time.Second

// Run runs every test of the package.
func Run(t *testing.T, h Harness) {
	t.Run("ExclusionWithGiveUpsOneLocker", func(t *testing.T) { exclusionWithGiveUps(t, h, 1) })
	t.Run("ExclusionWithGiveUpsTwoLockers", func(t *testing.T) { exclusionWithGiveUps(t, h, 2) })
	t.Run("GiveUpLeavesLine", func(t *testing.T) { giveUpLeavesLine(t, h) })
	t.Run("CloseEndsEveryWaiter", func(t *testing.T) { closeEndsEveryWaiter(t, h) })
	t.Run("OnePollerPerLocker", func(t *testing.T) { onePollerPerLocker(t, h) })
	t.Run("BusyLineDoesNotStarveAnotherLocker", func(t *testing.T) { busyLineDoesNotStarve(t, h) })
	t.Run("FloodedLineStillGrants", func(t *testing.T) { floodedLineStillGrants(t, h) })
}

func open(t *testing.T, h Harness) lockkit.Locker {
	l := h.New(t)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// key is fresh per run: a failed run may leave its lock behind for a lease.
func key(t *testing.T) string { return "linetest:" + t.Name() + ":" + rand.Text()[:8] }

// exclusionWithGiveUps: 16 goroutines over the given number of Lockers take
// turns on one key; a third of the attempts give up after a random moment
// (often mid-attempt). Each holder does a read-modify-write of a shared
// counter with a pause in between, so that any overlap shows as a lost
// update; the others must all be served, or a wake-up was lost.
func exclusionWithGiveUps(t *testing.T, h Harness, lockers int) {
	ls := make([]lockkit.Locker, lockers)
	for i := range ls {
		ls[i] = open(t, h)
	}
	k := key(t)
	const goroutines, rounds = 16, 12
	var inside, counter, grants, gaveUp atomic.Int64
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range goroutines {
		l := ls[g%lockers]
		wg.Go(func() {
			<-start
			for range rounds {
				ctx, cancel := context.WithTimeout(context.Background(), stuck)
				giveUp := mrand.N(3) == 0
				if giveUp {
					ctx, cancel = context.WithTimeout(context.Background(), mrand.N(5*time.Millisecond))
				}
				lease, err := l.Acquire(ctx, k, lockkit.WithTTL(leaseTTL))
				cancel()
				switch {
				case err == nil:
				case giveUp && (errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)):
					gaveUp.Add(1)
					continue
				default:
					t.Errorf("Acquire: %v (a waiter not served within %v: a lost wake-up?)", err, stuck)
					return
				}
				if n := inside.Add(1); n != 1 {
					t.Errorf("%d holders at once", n)
				}
				v := counter.Load()
				time.Sleep(500 * time.Microsecond)
				counter.Store(v + 1)
				grants.Add(1)
				inside.Add(-1)
				if err := lease.Release(context.Background()); err != nil {
					t.Errorf("Release: %v", err)
				}
			}
		})
	}
	close(start)
	wg.Wait()
	t.Logf("%d grants, %d give-ups", grants.Load(), gaveUp.Load())
	if counter.Load() != grants.Load() {
		t.Fatalf("counter %d after %d grants: holders overlapped", counter.Load(), grants.Load())
	}
}

type result struct {
	lease lockkit.Lease
	err   error
}

func acquireAsync(ctx context.Context, l lockkit.Locker, key string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		lease, err := l.Acquire(ctx, key, lockkit.WithTTL(leaseTTL))
		ch <- result{lease, err}
	}()
	return ch
}

func await(t *testing.T, ch <-chan result, what string) result {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(stuck):
		t.Fatalf("%s: not returned within %v", what, stuck)
		return result{}
	}
}

// giveUpLeavesLine: the head of a line gives up while the key is held here;
// the one behind it becomes head and is served when the holder releases.
// The holder's release is the only news: its lease is long, so nobody is
// served by its expiry.
func giveUpLeavesLine(t *testing.T, h Harness) {
	l := open(t, h)
	ctx, k := context.Background(), key(t)
	holder, err := l.Acquire(ctx, k, lockkit.WithTTL(leaseTTL))
	if err != nil {
		t.Fatal(err)
	}
	headCtx, giveUp := context.WithCancel(ctx)
	head := acquireAsync(headCtx, l, k)
	time.Sleep(50 * time.Millisecond) // first in line
	second := acquireAsync(ctx, l, k)
	time.Sleep(50 * time.Millisecond) // second in line
	giveUp()
	if r := await(t, head, "the head that gave up"); !errors.Is(r.err, context.Canceled) {
		t.Fatalf("the head that gave up: %v, want context.Canceled", r.err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	r := await(t, second, "the waiter behind the one that gave up")
	if r.err != nil {
		t.Fatalf("the waiter behind the one that gave up: %v", r.err)
	}
	_ = r.lease.Release(ctx)
}

// closeEndsEveryWaiter: Close ends the head and everyone behind it with
// ErrClosed.
func closeEndsEveryWaiter(t *testing.T, h Harness) {
	holderL, l := open(t, h), open(t, h)
	ctx, k := context.Background(), key(t)
	holder, err := holderL.Acquire(ctx, k, lockkit.WithTTL(leaseTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	waiters := make([]<-chan result, 5)
	for i := range waiters {
		waiters[i] = acquireAsync(ctx, l, k)
	}
	time.Sleep(100 * time.Millisecond) // all in line
	_ = l.Close()
	for i, w := range waiters {
		if r := await(t, w, "a waiter of a closed Locker"); !errors.Is(r.err, lockkit.ErrClosed) {
			t.Errorf("waiter %d of a closed Locker: %v, want ErrClosed", i, r.err)
		}
	}
}

// onePollerPerLocker: eight waiters of one Locker make about the calls one
// waiter makes, not eight times as many.
func onePollerPerLocker(t *testing.T, h Harness) {
	holderL := open(t, h)
	ctx, k := context.Background(), key(t)
	holder, err := holderL.Acquire(ctx, k, lockkit.WithTTL(leaseTTL))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	calls := func(waiters int) int64 {
		w := locktest.NewWire(t)
		l := h.Wired(t, w)
		defer l.Close()
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		var wg sync.WaitGroup
		for range waiters {
			wg.Go(func() { _, _ = l.Acquire(wctx, k, lockkit.WithTTL(leaseTTL)) })
		}
		time.Sleep(300 * time.Millisecond) // connected and in line
		before := w.Calls()
		time.Sleep(time.Second)
		n := w.Calls() - before
		cancel()
		wg.Wait()
		return n
	}
	one, eight := calls(1), calls(8)
	t.Logf("calls in 1s while waiting: one waiter %d, eight waiters %d", one, eight)
	if one == 0 {
		t.Fatal("a lone waiter made no calls: it must poll")
	}
	if eight > 2*one {
		t.Fatalf("eight waiters of one Locker made %d calls to one waiter's %d: each polls", eight, one)
	}
}

// busyLineDoesNotStarve: three goroutines of one Locker keep its line busy
// (each releases and queues again); a waiter of another Locker, which
// learns of a free key only by polling, is still served: within the
// longest run of hand-offs (backend.MaxHandOffRun) and one more.
func busyLineDoesNotStarve(t *testing.T, h Harness) {
	a, b := open(t, h), open(t, h)
	ctx, k := context.Background(), key(t)
	var grantsHere atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				lease, err := a.Acquire(ctx, k, lockkit.WithTTL(leaseTTL))
				if err != nil {
					t.Error(err)
					return
				}
				grantsHere.Add(1)
				time.Sleep(time.Millisecond)
				_ = lease.Release(ctx)
			}
		})
	}
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(100 * time.Millisecond) // the line is busy
	start := grantsHere.Load()
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	lease, err := b.Acquire(wctx, k, lockkit.WithTTL(leaseTTL))
	n := grantsHere.Load() - start
	if err != nil {
		t.Fatalf("waiter of another Locker, after %d grants to the busy one: %v", n, err)
	}
	_ = lease.Release(ctx)
	t.Logf("waiter of another Locker served after %d grants to the busy one", n)
	if bound := int64(backend.MaxHandOffRun + 2*backend.HandOffRun); n > bound {
		t.Fatalf("waiter of another Locker served after %d grants to the busy one; want at most %d", n, bound)
	}
}

// floodedLineStillGrants offers a key far more waiters than it can serve,
// as a service past its capacity does: three Lockers, each with a waiter
// arriving every millisecond with a short wait budget, at most 32 waiting
// per Locker (as an admission bound would), each holder busy 2 ms. In a
// first-come line past capacity the head is always the waiter with the
// least time left: if its try is cut by its deadline, the grant it won is
// wasted, and the next head is just as late, so the key could be granted
// all the time and used by nobody. The bound is liveness, a tenth of what
// the key can serve, not a speed claim.
func floodedLineStillGrants(t *testing.T, h Harness) {
	const (
		lockers  = 3
		budget   = 40 * time.Millisecond
		hold     = 2 * time.Millisecond
		arrivals = time.Millisecond
		perLine  = 32
		flood    = 2 * time.Second
	)
	k := key(t)
	ctx, cancel := context.WithTimeout(context.Background(), flood)
	defer cancel()
	var used, refused atomic.Int64
	var wg sync.WaitGroup
	for range lockers {
		l := open(t, h)
		slots := make(chan struct{}, perLine)
		wg.Go(func() {
			tick := time.NewTicker(arrivals)
			defer tick.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
				select {
				case slots <- struct{}{}:
				default:
					refused.Add(1) // turned away at the door
					continue
				}
				wg.Go(func() {
					defer func() { <-slots }()
					lease, err := l.Acquire(context.Background(), k, lockkit.WithTTL(leaseTTL), lockkit.WithWaitTimeout(budget))
					if err != nil {
						return
					}
					time.Sleep(hold)
					used.Add(1)
					_ = lease.Release(context.Background())
				})
			}
		})
	}
	wg.Wait()
	if want := int64(flood / (hold + time.Millisecond) / 10); used.Load() < want {
		t.Fatalf("flooded for %v, the key served %d holders (%d turned away at the door); want at least %d", flood, used.Load(), refused.Load(), want)
	}
	t.Logf("flooded for %v: %d holders served, %d turned away at the door", flood, used.Load(), refused.Load())
}
