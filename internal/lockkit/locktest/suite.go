package locktest

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// Environment of the helper processes the cross-process tests start.
const (
	envRole  = "LOCKTEST_HELPER"
	envKey   = "LOCKTEST_KEY"
	envFile  = "LOCKTEST_FILE"
	envIters = "LOCKTEST_ITERS"
	envTTL   = "LOCKTEST_TTL"
)

// Run runs the whole conformance suite against h. Call it from a top-level
// test function: the cross-process tests re-run that function in helper
// processes, where Run does the helper's part and exits.
func Run(t *testing.T, h Harness) {
	if role := os.Getenv(envRole); role != "" {
		runHelper(t, h, role)
		return
	}
	if h.TTL <= 0 {
		h.TTL = 300 * time.Millisecond
	}
	caps := h.capabilities(t)
	t.Logf("declared: %+v", caps)
	// Servers' client libraries start goroutines of their own when the
	// suite opens Lockers; only those still running after every Close are
	// leaks.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	s := &suite{h: h, caps: caps, prefix: "locktest:" + randomHex(4) + ":"}
	t.Run("MutualExclusion32Goroutines", s.mutualExclusion)
	t.Run("MutualExclusion3Processes", s.crossProcess)
	t.Run("ExpiryAfterHolderDies", s.expiryAfterCrash)
	t.Run("OwnerCheckedRelease", s.ownerCheckedRelease)
	t.Run("ReleaseCanBeRetried", s.releaseRetried)
	t.Run("Extend", s.extend)
	t.Run("ExtendAfterTakeover", s.extendAfterTakeover)
	t.Run("ExtendRacingWatchdog", s.extendRacingWatchdog)
	t.Run("WatchdogOutlives3TTLs", s.watchdog)
	t.Run("LostWhenDeletedBehindHoldersBack", s.lostSignal)
	t.Run("FencesStrictlyIncrease", s.fences)
	t.Run("CancelWhileWaiting", s.cancelWhileWaiting)
	t.Run("CancelWhileWaitingOnSilentServer", s.cancelOnSilentServer)
	t.Run("ReleaseWhileRenewalHangs", s.releaseWhileRenewalHangs)
	t.Run("CloseRacingAcquireLeaksNothing", s.closeRacingAcquire)
	t.Run("WaitWithoutPolling", s.waitWithoutPolling)
	t.Run("WaitTimeout", s.waitTimeout)
	t.Run("TryAcquireOnHeldKey", s.tryAcquireHeld)
	t.Run("Reentrancy", s.reentrancy)
	t.Run("FairOrder", s.fairOrder)
	t.Run("HandOffLatency", s.handOff)
}

func (h Harness) capabilities(t testing.TB) lockkit.Capabilities {
	if h.Caps != nil {
		return *h.Caps
	}
	l := h.New(t)
	defer l.Close()
	d, ok := l.(lockkit.Describer)
	if !ok {
		t.Fatalf("%T declares no Capabilities: implement lockkit.Describer or set Harness.Caps", l)
	}
	return d.Capabilities()
}

type suite struct {
	h      Harness
	caps   lockkit.Capabilities
	prefix string
}

func (s *suite) key(t testing.TB) string { return s.prefix + t.Name() }

func (s *suite) open(t testing.TB) lockkit.Locker {
	l := s.h.New(t)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// crashBound is how long a dead holder's grant may outlive it, generously:
// these are correctness bounds, not speed claims.
func (s *suite) crashBound() time.Duration { return 2*s.h.TTL + s.h.CrashSlack + 5*time.Second }

func (s *suite) mutualExclusion(t *testing.T) {
	lockers := []lockkit.Locker{s.open(t), s.open(t), s.open(t), s.open(t)}
	const goroutines, iterations = 32, 5
	c := Contend(t, lockers, s.key(t), goroutines, iterations, lockkit.WithAutoRenew(s.h.TTL))
	if c.Overlaps != 0 || c.Lost != 0 {
		t.Fatalf("two holders at once: %d critical sections entered while another was inside, %d of %d increments lost",
			c.Overlaps, c.Lost, goroutines*iterations)
	}
	if c.LeasesLost > 0 {
		t.Logf("%d leases lost while their holder was inside (a loaded machine), none overlapped", c.LeasesLost)
	}
}

// Contention is what Contend saw.
type Contention struct {
	// Overlaps counts critical sections entered while another was inside:
	// any at all means two holders at once, even if no update was lost.
	Overlaps int
	// Lost counts the increments that overlapping sections overwrote.
	Lost int
	// LeasesLost counts sections whose lease was lost before they ended
	// (Do's ErrLeaseLost): slow, but exclusive unless Overlaps says not.
	LeasesLost int
}

// Contend runs goroutines that each increment an unprotected counter
// iterations times under key, spread over lockers, all released at once.
// A lock yields a zero Contention; lockkit.None shows what the lock
// prevents.
func Contend(t testing.TB, lockers []lockkit.Locker, key string, goroutines, iterations int, opts ...lockkit.Option) Contention {
	t.Helper()
	var (
		// Atomic loads and stores keep the race detector quiet; the
		// load-sleep-store cycle still loses updates without a lock.
		counter atomic.Int64
		inside  atomic.Int32
		overlap atomic.Int32
		// leasesLost counts sections Do reported ErrLeaseLost for.
		leasesLost atomic.Int32
		start      = make(chan struct{})
		wg         sync.WaitGroup
		errs       = make(chan error, goroutines)
	)
	for g := range goroutines {
		wg.Go(func() {
			l := lockers[g%len(lockers)]
			<-start
			for done := 0; done < iterations; {
				ran := false
				err := lockkit.Do(context.Background(), l, key, func(context.Context, uint64) error {
					ran = true
					if inside.Add(1) > 1 {
						overlap.Add(1)
					}
					v := counter.Load()
					time.Sleep(100 * time.Microsecond) // widen the window a lost update needs
					counter.Store(v + 1)
					inside.Add(-1)
					return nil
				}, opts...)
				if ran {
					done++
				}
				switch {
				case errors.Is(err, lockkit.ErrLeaseLost):
					// Not handed over (ran is false: try again), or lost
					// while inside: whether another holder came in
					// meanwhile is for the overlap count to say.
					if ran {
						leasesLost.Add(1)
					}
				case err != nil:
					errs <- err
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Do: %v", err)
	}
	return Contention{Overlaps: int(overlap.Load()), Lost: goroutines*iterations - int(counter.Load()),
		LeasesLost: int(leasesLost.Load())}
}

func (s *suite) crossProcess(t *testing.T) {
	if !s.caps.CrossProcess {
		// Absent as declared: while another process holds the key, this
		// one must be granted it too, or the declaration is wrong.
		_, kill := s.startHolder(t)
		defer kill()
		lease, err := s.open(t).TryAcquire(context.Background(), s.key(t), lockkit.WithTTL(10*time.Second))
		if err != nil {
			t.Fatalf("backend declares no cross-process exclusion, but was refused a key another process holds: %v", err)
		}
		_ = lease.Release(context.Background())
		return
	}
	const processes, iterations = 3, 20
	file := t.TempDir() + "/counter"
	if err := os.WriteFile(file, []byte("0"), 0o600); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	outputs := make([][]byte, processes)
	errs := make([]error, processes)
	for p := range processes {
		cmd := s.helper(t, "increment", file, iterations)
		wg.Go(func() { outputs[p], errs[p] = cmd.CombinedOutput() })
	}
	wg.Wait()
	for p := range processes {
		if errs[p] != nil {
			t.Fatalf("helper %d: %v\n%s", p, errs[p], outputs[p])
		}
	}
	got, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if want := strconv.Itoa(processes * iterations); string(got) != want {
		t.Fatalf("counter = %s after %d processes x %d increments, want %s", got, processes, iterations, want)
	}
}

func (s *suite) expiryAfterCrash(t *testing.T) {
	key := s.key(t)
	if s.caps.CrossProcess {
		_, kill := s.startHolder(t)
		kill() // SIGKILL: no release, no goodbye to the server
	} else {
		l := s.h.New(t)
		mustTry(t, l, key, lockkit.WithTTL(s.h.TTL))
		// The holder "dies": its lease is never released.
		defer l.Close()
	}
	other := s.open(t)
	ctx, cancel := context.WithTimeout(context.Background(), s.crashBound())
	defer cancel()
	lease, err := other.Acquire(ctx, key, lockkit.WithTTL(s.h.TTL))
	switch {
	case s.caps.Expires && err != nil:
		t.Fatalf("lock of a dead holder still not granted after %v: %v", s.crashBound(), err)
	case !s.caps.Expires && err == nil:
		_ = lease.Release(context.Background())
		t.Fatal("backend declares no expiry, but a dead holder's lock was granted to another client")
	case !s.caps.Expires && !errors.Is(err, context.DeadlineExceeded):
		t.Fatalf("Acquire of a dead holder's lock = %v, want it still held after %v", err, s.crashBound())
	case err == nil:
		_ = lease.Release(context.Background())
	}
}

func (s *suite) ownerCheckedRelease(t *testing.T) {
	if !s.caps.OwnerCheck {
		t.Fatal("every backend but none must check the owner")
	}
	ctx := context.Background()
	key := s.key(t)
	a, b, c := s.open(t), s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithTTL(s.h.TTL))
	<-la.Lost() // a's lease ran out: b may now take the key
	lb := mustAcquire(t, b, key, lockkit.WithTTL(10*time.Second))
	if err := la.Release(ctx); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("release by a former holder = %v, want ErrNotHeld", err)
	}
	if err := la.Extend(ctx, time.Minute); err == nil {
		t.Fatal("extend by a former holder succeeded")
	}
	if lc, err := c.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		if lc != nil {
			_ = lc.Release(ctx)
		}
		t.Fatalf("after a non-owner's release, TryAcquire = %v, want ErrNotAcquired: the release freed another holder's lock", err)
	}
	if err := lb.Release(ctx); err != nil {
		t.Fatalf("release by the holder: %v", err)
	}
	if err := lb.Release(ctx); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("second release = %v, want ErrNotHeld", err)
	}
	lc := mustTry(t, c, key)
	_ = lc.Release(ctx)
}

func (s *suite) extend(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	a, b := s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithTTL(s.h.TTL))
	if err := la.Extend(ctx, 4*s.h.TTL); err != nil {
		t.Fatalf("extend: %v", err)
	}
	time.Sleep(2 * s.h.TTL) // past the first TTL, within the extension
	select {
	case <-la.Lost():
		t.Fatal("Lost closed within the extended lease")
	default:
	}
	if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("TryAcquire within the extended lease = %v, want ErrNotAcquired", err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
}

// extendAfterTakeover reaches the store's owner check: the key is taken
// away and granted to another client while the first holder's Lost is
// still open (its TTL is long), so the lease cannot answer from what it
// knows and must ask the store.
func (s *suite) extendAfterTakeover(t *testing.T) {
	if s.h.Steal == nil {
		t.Fatal("Harness.Steal is required: every backend's grants can be deleted by an operator")
	}
	ctx := context.Background()
	key := s.key(t)
	a, b, c := s.open(t), s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithTTL(time.Minute))
	s.h.Steal(t, key)
	bTTL := 4 * s.h.TTL
	lb := mustAcquire(t, b, key, lockkit.WithTTL(bTTL))
	defer lb.Release(ctx)
	lostFirst := backend.IsClosed(la.Lost())
	err := la.Extend(ctx, time.Minute)
	switch {
	case lostFirst && !errors.Is(err, lockkit.ErrLeaseLost):
		t.Fatalf("Extend after Lost closed = %v, want ErrLeaseLost", err)
	case lostFirst:
		t.Log("the holder learned of the takeover through Lost before it could Extend")
	case !errors.Is(err, lockkit.ErrNotHeld):
		t.Fatalf("Extend of a key another owner holds = %v, want ErrNotHeld", err)
	}
	if !backend.IsClosed(la.Lost()) {
		t.Fatal("Extend found the key taken but left Lost open")
	}
	// Nothing changed: the new holder still holds the key, for no longer
	// than its own TTL (a non-owner's extend did not lengthen it).
	if lc, err := c.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		if lc != nil {
			_ = lc.Release(ctx)
		}
		t.Fatalf("after a non-owner's Extend, TryAcquire = %v, want ErrNotAcquired", err)
	}
	wctx, cancel := context.WithTimeout(ctx, bTTL+s.crashBound())
	defer cancel()
	lc, err := c.Acquire(wctx, key, lockkit.WithTTL(s.h.TTL))
	if err != nil {
		t.Fatalf("the new holder's %v grant was not over after %v: a non-owner's Extend lengthened it (%v)", bTTL, bTTL+s.crashBound(), err)
	}
	_ = lc.Release(ctx)
}

func (s *suite) watchdog(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	a, b := s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithAutoRenew(s.h.TTL))
	time.Sleep(3*s.h.TTL + s.h.TTL/2)
	select {
	case <-la.Lost():
		t.Fatal("watchdog let the lease go while its holder lived")
	default:
	}
	if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("TryAcquire after 3 TTLs of a renewed lease = %v, want ErrNotAcquired", err)
	}
	if err := la.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	lb := mustTry(t, b, key)
	_ = lb.Release(ctx)
}

func (s *suite) lostSignal(t *testing.T) {
	if s.h.Steal == nil {
		t.Fatal("Harness.Steal is required: every backend's grants can be deleted by an operator")
	}
	key := s.key(t)
	a := s.open(t)
	var fnErr error
	granted := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		fnErr = lockkit.Do(context.Background(), a, key, func(ctx context.Context, _ uint64) error {
			close(granted)
			<-ctx.Done()
			return context.Cause(ctx)
		}, lockkit.WithAutoRenew(s.h.TTL))
	}()
	<-granted
	s.h.Steal(t, key)
	select {
	case <-done:
		if !s.caps.LostSignal {
			t.Fatalf("backend declares no lost-lease signal, but Do was cancelled: %v", fnErr)
		}
		if !errors.Is(fnErr, lockkit.ErrLeaseLost) {
			t.Fatalf("Do's context ended with %v, want ErrLeaseLost", fnErr)
		}
	case <-time.After(s.crashBound()):
		if s.caps.LostSignal {
			t.Fatalf("lease deleted behind the holder's back, Lost not closed after %v", s.crashBound())
		}
		t.Log("absent as declared: the holder never learns its lease was taken")
	}
}

func (s *suite) fences(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	lockers := []lockkit.Locker{s.open(t), s.open(t)}
	var last uint64
	const grants = 1000
	for i := range grants {
		lease := mustAcquire(t, lockers[i%2], key, lockkit.WithTTL(10*time.Second))
		fence := lease.Fence()
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
		if !s.caps.Fencing {
			if fence != 0 {
				t.Fatalf("backend declares no fencing but grant %d has fence %d", i, fence)
			}
			continue
		}
		if fence <= last {
			t.Fatalf("grant %d has fence %d, not above the previous %d", i, fence, last)
		}
		last = fence
	}
}

func (s *suite) cancelWhileWaiting(t *testing.T) {
	key := s.key(t)
	a, b, c := s.open(t), s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithTTL(30*time.Second))
	ctx, cancel := context.WithCancel(context.Background())
	result := make(chan error, 1)
	go func() {
		lease, err := b.Acquire(ctx, key)
		if lease != nil {
			_ = lease.Release(context.Background())
		}
		result <- err
	}()
	time.Sleep(200 * time.Millisecond) // let b start waiting
	cancel()
	select {
	case err := <-result:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire after cancel = %v, want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Acquire did not return after its context was cancelled while the holder kept the lock")
	}
	// The cancelled waiter must leave nothing behind that delays others.
	if err := la.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	lc := mustAcquire(t, c, key, lockkit.WithWaitTimeout(5*time.Second))
	_ = lc.Release(context.Background())
}

func (s *suite) waitTimeout(t *testing.T) {
	key := s.key(t)
	a, b := s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithTTL(30*time.Second))
	defer la.Release(context.Background())
	_, err := b.Acquire(context.Background(), key, lockkit.WithWaitTimeout(100*time.Millisecond))
	if !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("Acquire past its wait timeout = %v, want ErrNotAcquired", err)
	}
}

func (s *suite) tryAcquireHeld(t *testing.T) {
	key := s.key(t)
	a, b := s.open(t), s.open(t)
	la := mustTry(t, a, key, lockkit.WithTTL(30*time.Second))
	defer la.Release(context.Background())
	// The holder keeps the key for 30 s; TryAcquire must answer long before.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := b.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("TryAcquire on a held key = %v, want ErrNotAcquired", err)
	}
}

func (s *suite) reentrancy(t *testing.T) {
	t.Run("Declared", s.declaredReentrancy)
	t.Run("Wrapped", s.wrappedReentrancy)
}

// declaredReentrancy holds the bare Locker to its Capabilities.Reentrant.
func (s *suite) declaredReentrancy(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	l, other := s.open(t), s.open(t)
	alice := lockkit.WithOwner(ctx, "alice")
	outer := mustTry(t, l, key, lockkit.WithTTL(30*time.Second), withCtx(alice))
	inner, err := l.TryAcquire(alice, key, lockkit.WithTTL(30*time.Second))
	if !s.caps.Reentrant {
		if err == nil {
			_ = inner.Release(ctx)
			t.Fatal("backend declares no reentrancy, but granted a key its owner holds")
		}
		if !errors.Is(err, lockkit.ErrNotAcquired) {
			t.Fatalf("owner's second TryAcquire = %v, want ErrNotAcquired", err)
		}
		_ = outer.Release(ctx)
		return
	}
	if err != nil {
		t.Fatalf("backend declares reentrancy, but its owner's second TryAcquire = %v", err)
	}
	if err := inner.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("after the inner release the key must still be held; TryAcquire = %v", err)
	}
	if err := outer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lo := mustTry(t, other, key)
	_ = lo.Release(ctx)
}

// wrappedReentrancy proves lockkit.Reentrant over the backend.
func (s *suite) wrappedReentrancy(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	l := lockkit.Reentrant(s.open(t))
	other := s.open(t)
	alice := lockkit.WithOwner(ctx, "alice")
	outer := mustTry(t, l, key, lockkit.WithTTL(30*time.Second))
	_ = outer.Release(ctx) // without an owner there is no nesting: plain grant
	outer = mustAcquire(t, l, key, lockkit.WithTTL(30*time.Second), withCtx(alice))
	inner := mustAcquire(t, l, key, lockkit.WithTTL(30*time.Second), withCtx(alice))
	if inner.Fence() != outer.Fence() {
		t.Fatalf("nested grant has fence %d, the outer %d: a nested grant is the same grant", inner.Fence(), outer.Fence())
	}
	if _, err := l.TryAcquire(lockkit.WithOwner(ctx, "bob"), key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("another owner's TryAcquire = %v, want ErrNotAcquired", err)
	}
	if err := inner.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := other.TryAcquire(ctx, key); !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("after the inner release the key must still be held; TryAcquire = %v", err)
	}
	if err := outer.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lo := mustTry(t, other, key)
	_ = lo.Release(ctx)
}

// fairOrder holds the backend to Capabilities.Fair. Waiters arrive one
// by one, several per Locker and interleaved between Lockers (a queue kept
// per process is not arrival order), and a newcomer tries the key the
// moment it is released. Declared fair: grants follow arrival and the
// newcomer is never served first. Not declared: some round must show it.
func (s *suite) fairOrder(t *testing.T) {
	lockers := []lockkit.Locker{s.open(t), s.open(t)}
	holder, newcomer := s.open(t), s.open(t)
	arrivals := []int{0, 0, 1, 1, 0, 1} // the Locker each waiter uses
	rounds := 1
	if !s.caps.Fair {
		rounds = 5
	}
	for r := range rounds {
		got := s.fairRound(t, fmt.Sprintf("%s:%d", s.key(t), r), holder, newcomer, lockers, arrivals)
		inOrder := slices.IsSorted(got)
		switch {
		case s.caps.Fair && !inOrder:
			t.Fatalf("backend declares fair order; arrivals 0..%d (Lockers %v, newcomer %d) were granted %v",
				len(arrivals)-1, arrivals, len(arrivals), got)
		case !s.caps.Fair && !inOrder:
			t.Logf("absent as declared: round %d granted %v", r, got)
			return
		}
	}
	if !s.caps.Fair {
		t.Fatalf("backend declares no fair order, but %d rounds were each granted in arrival order, "+
			"newcomer included: declare Fair, or show where it breaks", rounds)
	}
}

// fairRound returns the arrival numbers in grant order; the newcomer is
// number len(arrivals) and appears only if it was granted.
func (s *suite) fairRound(t *testing.T, key string, holder, newcomer lockkit.Locker, lockers []lockkit.Locker, arrivals []int) []int {
	ctx := context.Background()
	lh := mustTry(t, holder, key, lockkit.WithTTL(30*time.Second))
	order := make(chan int, len(arrivals)+1)
	var wg sync.WaitGroup
	for i, li := range arrivals {
		l := lockers[li]
		wg.Go(func() {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			lease, err := l.Acquire(wctx, key, lockkit.WithFair(), lockkit.WithTTL(30*time.Second))
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			order <- i
			_ = lease.Release(ctx)
		})
		time.Sleep(150 * time.Millisecond) // waiter i is queued before i+1 arrives
	}
	_ = lh.Release(ctx)
	ln, err := newcomer.TryAcquire(ctx, key, lockkit.WithFair(), lockkit.WithTTL(30*time.Second))
	switch {
	case err == nil:
		order <- len(arrivals)
		_ = ln.Release(ctx)
	case !errors.Is(err, lockkit.ErrNotAcquired):
		t.Fatalf("newcomer's TryAcquire: %v", err)
	}
	wg.Wait()
	close(order)
	var got []int
	for i := range order {
		got = append(got, i)
	}
	if t.Failed() {
		t.FailNow()
	}
	return got
}

// handOff measures how soon a waiter gets a released key, so the
// backends table can show what waiting without polling is worth. It is
// reported, not asserted: the machines are shared and noisy.
func (s *suite) handOff(t *testing.T) {
	key := s.key(t)
	a, b := s.open(t), s.open(t)
	var samples []time.Duration
	for range 10 {
		la := mustTry(t, a, key, lockkit.WithTTL(30*time.Second))
		got := make(chan time.Time, 1)
		go func() {
			lb, err := b.Acquire(context.Background(), key, lockkit.WithTTL(30*time.Second))
			granted := time.Now()
			if err == nil {
				_ = lb.Release(context.Background())
			}
			got <- granted
		}()
		time.Sleep(20 * time.Millisecond)
		released := time.Now()
		_ = la.Release(context.Background())
		samples = append(samples, (<-got).Sub(released))
	}
	slices.Sort(samples)
	t.Logf("release-to-grant of a waiting client: median %v, max %v (WaitNoPoll declared: %v)",
		samples[len(samples)/2], samples[len(samples)-1], s.caps.WaitNoPoll)
}

// startHolder starts a helper process that acquires the test's key and
// holds it until killed; kill sends SIGKILL and reaps it.
func (s *suite) startHolder(t *testing.T) (cmd *exec.Cmd, kill func()) {
	t.Helper()
	cmd = s.helper(t, "hold", "", 0)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	kill = func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "held") {
		kill()
		t.Fatalf("helper did not report holding the lock: %q %v", line, err)
	}
	return cmd, kill
}

// helper returns a command that re-runs the current top-level test as a
// helper process with role.
func (s *suite) helper(t *testing.T, role, file string, iterations int) *exec.Cmd {
	top, _, _ := strings.Cut(t.Name(), "/")
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(top)+"$", "-test.count=1")
	cmd.Env = append(os.Environ(),
		envRole+"="+role,
		envKey+"="+s.key(t),
		envFile+"="+file,
		envIters+"="+strconv.Itoa(iterations),
		envTTL+"="+s.h.TTL.String(),
	)
	return cmd
}

// runHelper is the helper process's side of the cross-process tests.
func runHelper(t *testing.T, h Harness, role string) {
	key := os.Getenv(envKey)
	ttl, _ := time.ParseDuration(os.Getenv(envTTL))
	l := h.New(t)
	ctx := context.Background()
	switch role {
	case "increment":
		n, _ := strconv.Atoi(os.Getenv(envIters))
		file := os.Getenv(envFile)
		for done := 0; done < n; {
			ran := false
			err := lockkit.Do(ctx, l, key, func(context.Context, uint64) error {
				ran = true
				// The marker exists only while some process is inside:
				// finding it is an overlap, even one that loses no update.
				inside, err := os.OpenFile(file+".inside", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
				if err != nil {
					return fmt.Errorf("two holders at once: %w", err)
				}
				_ = inside.Close()
				defer os.Remove(file + ".inside")
				b, err := os.ReadFile(file)
				if err != nil {
					return err
				}
				v, err := strconv.Atoi(string(b))
				if err != nil {
					return err
				}
				time.Sleep(time.Millisecond)
				return os.WriteFile(file, []byte(strconv.Itoa(v+1)), 0o600)
			}, lockkit.WithAutoRenew(ttl))
			if ran {
				done++
			}
			// A lease lost on a loaded machine is not two holders: the
			// marker file is what tells.
			if err != nil && !errors.Is(err, lockkit.ErrLeaseLost) {
				fmt.Fprintln(os.Stderr, "increment:", err)
				os.Exit(1)
			}
		}
		_ = l.Close()
		os.Exit(0)
	case "hold":
		if _, err := l.Acquire(ctx, key, lockkit.WithTTL(ttl)); err != nil {
			fmt.Fprintln(os.Stderr, "hold:", err)
			os.Exit(1)
		}
		fmt.Println("held")
		select {} // until the parent kills us
	default:
		fmt.Fprintln(os.Stderr, "unknown helper role", role)
		os.Exit(2)
	}
}

type ctxOption struct{ ctx context.Context }

// withCtx lets mustAcquire take a context among its options.
func withCtx(ctx context.Context) any { return ctxOption{ctx} }

func mustAcquire(t testing.TB, l lockkit.Locker, key string, opts ...any) lockkit.Lease {
	t.Helper()
	ctx, lopts := splitOpts(opts)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, key, lopts...)
	if err != nil {
		t.Fatalf("Acquire %s: %v", key, err)
	}
	return lease
}

func mustTry(t testing.TB, l lockkit.Locker, key string, opts ...any) lockkit.Lease {
	t.Helper()
	ctx, lopts := splitOpts(opts)
	lease, err := l.TryAcquire(ctx, key, lopts...)
	if err != nil {
		t.Fatalf("TryAcquire %s: %v", key, err)
	}
	return lease
}

func splitOpts(opts []any) (context.Context, []lockkit.Option) {
	ctx := context.Background()
	var lopts []lockkit.Option
	for _, o := range opts {
		switch o := o.(type) {
		case ctxOption:
			ctx = o.ctx
		case lockkit.Option:
			lopts = append(lopts, o)
		}
	}
	return ctx, lopts
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
