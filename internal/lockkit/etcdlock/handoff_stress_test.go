package etcdlock

import (
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// handOffRun is the record of TestHandOffsKeepExclusionAndRisingFences:
// who holds the key, the last fence granted, and what went wrong.
type handOffRun struct {
	mu       sync.Mutex
	holder   lockkit.Lease // inside the critical section, nil if none
	last     uint64
	granted  int
	gaveUp   int
	lost     int
	failures []string
}

func (r *handOffRun) fail(format string, args ...any) {
	r.mu.Lock()
	r.failures = append(r.failures, fmt.Sprintf(format, args...))
	r.mu.Unlock()
}

// done says the run has granted enough, or has failed.
func (r *handOffRun) done(grants int) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.granted >= grants || len(r.failures) > 0
}

// isLost says the lease's Lost has closed (a session lost under load: its
// keep-alives are late): it is held no longer, as the lock says.
func isLost(lease lockkit.Lease) bool {
	select {
	case <-lease.Lost():
		return true
	default:
		return false
	}
}

// enter records lease as the holder, failing the run if another lease
// still holds or the fence does not rise; false if lease is lost already.
func (r *handOffRun) enter(lease lockkit.Lease) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if isLost(lease) {
		r.lost++
		return false
	}
	if r.holder != nil && !isLost(r.holder) {
		r.failures = append(r.failures, fmt.Sprintf("fence %d granted while fence %d is held", lease.Fence(), r.holder.Fence()))
	}
	if lease.Fence() <= r.last {
		r.failures = append(r.failures, fmt.Sprintf("fence %d granted after %d", lease.Fence(), r.last))
	}
	r.holder, r.last = lease, lease.Fence()
	r.granted++
	return true
}

func (r *handOffRun) leave(lease lockkit.Lease) {
	r.mu.Lock()
	if r.holder == lease {
		r.holder = nil
	}
	r.mu.Unlock()
	if err := lease.Release(context.Background()); err != nil && !(errors.Is(err, lockkit.ErrNotHeld) && isLost(lease)) {
		r.fail("Release of fence %d: %v", lease.Fence(), err)
	}
}

// waiter acquires key on l until the run is done, giving up at random
// (one wait in four has a deadline of under 3 ms).
func (r *handOffRun) waiter(l *Locker, key string, seed uint64, grants int) {
	rnd := mrand.New(mrand.NewPCG(seed, 1))
	for !r.done(grants) {
		timeout := 10 * time.Second
		if rnd.IntN(4) == 0 {
			timeout = time.Duration(rnd.IntN(3000)) * time.Microsecond
		}
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		t0 := time.Now()
		lease, err := l.Acquire(ctx, key, lockkit.WithTTL(time.Minute))
		cancel()
		if waited := time.Since(t0); waited > 5*time.Second {
			// Critical sections are short: a wait this long is a
			// waiter left behind a key nobody will delete.
			r.fail("an Acquire waited %v (err %v)", waited, err)
		}
		if err != nil {
			// The server may see a short deadline pass first, and
			// say so in its own words.
			if timeout > time.Second && !errors.Is(err, context.DeadlineExceeded) {
				r.fail("Acquire: %v", err)
			}
			r.mu.Lock()
			r.gaveUp++
			r.mu.Unlock()
			continue
		}
		if r.enter(lease) {
			time.Sleep(time.Duration(rnd.IntN(500)) * time.Microsecond)
		}
		r.leave(lease)
	}
}

// probe keeps trying key on a Locker of its own until stop closes: it must
// never get it while it is held (it may between holders).
func (r *handOffRun) probe(l *Locker, key string, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		lease, err := l.TryAcquire(context.Background(), key, lockkit.WithTTL(time.Minute))
		if err == nil {
			r.enter(lease)
			r.leave(lease)
		} else if !errors.Is(err, lockkit.ErrNotAcquired) {
			r.fail("TryAcquire: %v", err)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Many goroutines on two Lockers, some giving up at random while they
// wait, hand one key around: never two holders at once (checked by the
// holders and by a TryAcquire of another Locker), every grant's fence
// above the one before it, and no waiter left behind.
func TestHandOffsKeepExclusionAndRisingFences(t *testing.T) {
	endpoints := serverEndpoints(t)
	a, akv := countedLocker(t)
	b, bkv := countedLocker(t)
	probe := open(t, endpoints)
	key := "etcdlock:test:" + t.Name()
	const goroutines, grants = 8, 300
	r := &handOffRun{}
	var wg sync.WaitGroup
	for g := range goroutines {
		l := []*Locker{a, b}[g%2]
		wg.Go(func() { r.waiter(l, key, uint64(g), grants) })
	}
	stop := make(chan struct{})
	wg.Go(func() { r.probe(probe, key, stop) })
	for !r.done(grants) {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	for _, f := range r.failures {
		t.Error(f)
	}
	calls := sum(akv.snapshot()) + sum(bkv.snapshot())
	t.Logf("%d grants, %d give-ups, %d leases born lost, %d calls of the two Lockers", r.granted, r.gaveUp, r.lost, calls)
	if r.gaveUp == 0 {
		t.Error("nobody gave up: the run tested less than it should")
	}
}
