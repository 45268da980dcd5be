package backend_test

import (
	"context"
	"errors"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// store is a fake lock server for one grant: it applies each Extend the
// moment the request arrives and sends the reply when the test says, so
// a test can order what the server applied and what the client processed
// independently. Pure logic: the lease's own bookkeeping is under test.
type store struct {
	mu      sync.Mutex
	expires time.Time // when the server lets the grant go
	silent  bool      // requests neither applied nor answered
	calls   chan *call
}

type call struct {
	ttl   time.Duration
	ctx   context.Context
	reply chan error
}

func newStore(ttl time.Duration) *store {
	return &store{expires: time.Now().Add(ttl), calls: make(chan *call, 16)}
}

func (s *store) extend(ctx context.Context, ttl time.Duration) error {
	s.mu.Lock()
	silent := s.silent
	if !silent {
		s.expires = time.Now().Add(ttl)
	}
	s.mu.Unlock()
	c := &call{ttl: ttl, ctx: ctx, reply: make(chan error, 1)}
	if !silent {
		s.calls <- c
	}
	select {
	case err := <-c.reply:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *store) silence() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.silent = true
}

func (s *store) expiry() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.expires
}

func (s *store) next(t *testing.T, within time.Duration) *call {
	t.Helper()
	select {
	case c := <-s.calls:
		return c
	case <-time.After(within):
		return nil
	}
}

// The holder must stop trusting its lease no later than the server lets
// the grant go, plus timer noise.
func requireLostBy(t *testing.T, lease lockkit.Lease, serverExpiry time.Time) {
	t.Helper()
	select {
	case <-lease.Lost():
	case <-time.After(time.Until(serverExpiry) + 200*time.Millisecond):
		t.Fatalf("Lost still open %v after the server let the grant go", time.Since(serverExpiry))
	}
}

// An Extend that shortens the lease while the watchdog's renewal is in
// flight: the server applies the renewal, then the Extend; the replies
// come back the other way round. The holder must not keep the renewal's
// longer deadline.
func TestExtendRacingRenewalFollowsTheServer(t *testing.T) {
	const long, short = 600 * time.Millisecond, 100 * time.Millisecond
	s := newStore(long)
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: long, Watchdog: true, Extend: s.extend,
		Release: func(context.Context) error { return nil }})
	renewal := s.next(t, 2*long)
	if renewal == nil || renewal.ttl != long {
		t.Fatalf("no renewal of %v from the watchdog: %+v", long, renewal)
	}
	extended := make(chan error, 1)
	go func() { extended <- lease.Extend(context.Background(), short) }()
	if ext := s.next(t, 100*time.Millisecond); ext != nil {
		// Both in flight: the server applied the Extend last, and the
		// Extend's reply arrives first.
		s.silence()
		ext.reply <- nil
		if err := <-extended; err != nil {
			t.Fatal(err)
		}
		renewal.reply <- nil
	} else {
		// The Extend waited for the renewal: no overlap to reorder.
		renewal.reply <- nil
		ext = s.next(t, time.Second)
		if ext == nil {
			t.Fatal("Extend never reached the store")
		}
		s.silence()
		ext.reply <- nil
		if err := <-extended; err != nil {
			t.Fatal(err)
		}
	}
	requireLostBy(t, lease, s.expiry())
}

// An Extend whose reply never came may have been applied: the holder must
// then trust the shorter of the two deadlines.
func TestExtendWithUnknownOutcomeTrustsTheShorterDeadline(t *testing.T) {
	s := newStore(time.Minute)
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: time.Minute, Extend: s.extend,
		Release: func(context.Context) error { return nil }})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := lease.Extend(ctx, 100*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Extend without a reply = %v, want its context's error", err)
	}
	requireLostBy(t, lease, s.expiry())
}

// Release is bounded by its own context while a renewal hangs on a
// server that ignores the renewal's context, and it
// ends that renewal rather than leave it running to the lease's deadline.
func TestReleaseDoesNotWaitForAHungRenewal(t *testing.T) {
	const ttl = 300 * time.Millisecond
	hung := make(chan *call, 1)
	unblock := make(chan struct{})
	defer close(unblock)
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: ttl, Watchdog: true,
		Extend: func(ctx context.Context, ttl time.Duration) error {
			hung <- &call{ttl: ttl, ctx: ctx}
			<-unblock // a driver that does not look at ctx
			return ctx.Err()
		},
		Release: func(context.Context) error { return nil }})
	renewal := <-hung
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	released := make(chan error, 1)
	go func() { released <- lease.Release(ctx) }()
	select {
	case err := <-released:
		if err != nil {
			t.Fatalf("Release: %v", err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Release waited for a renewal that hangs")
	}
	if !backend.IsClosed(lease.Lost()) {
		t.Fatal("Lost open after Release")
	}
	select {
	case <-renewal.ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("the hung renewal's context was not cancelled by Release")
	}
}

func TestWatchdogRenewsEveryThirdOfTTL(t *testing.T) {
	const ttl = 150 * time.Millisecond
	s := newStore(ttl)
	go func() {
		for c := range s.calls {
			c.reply <- nil
		}
	}()
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: ttl, Watchdog: true, Extend: s.extend,
		Release: func(context.Context) error { return nil }})
	time.Sleep(4 * ttl)
	if backend.IsClosed(lease.Lost()) {
		t.Fatal("a renewed lease was lost")
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(context.Background()); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("second Release = %v, want ErrNotHeld", err)
	}
	if err := lease.Extend(context.Background(), ttl); !errors.Is(err, lockkit.ErrLeaseLost) {
		t.Fatalf("Extend after Release = %v, want ErrLeaseLost", err)
	}
}

// A renewal that finds the grant gone loses the lease at once, not at
// its deadline.
func TestWatchdogLosesTheLeaseWhenNotHeld(t *testing.T) {
	const ttl = 3 * time.Second // first renewal at 1 s
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: ttl, Watchdog: true,
		Extend:  func(context.Context, time.Duration) error { return lockkit.ErrNotHeld },
		Release: func(context.Context) error { return lockkit.ErrNotHeld }})
	select {
	case <-lease.Lost():
	case <-time.After(2 * ttl / 3):
		t.Fatal("renewal found the grant gone, Lost still open")
	}
}

// A renewal that fails for a transient reason is tried again; if none
// succeeds, the lease is lost at its deadline, not before.
func TestWatchdogRetriesTransientErrorsUntilTheDeadline(t *testing.T) {
	const ttl = 300 * time.Millisecond
	var mu sync.Mutex
	attempts := 0
	start := time.Now()
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: ttl, Watchdog: true, Sent: start,
		Extend: func(context.Context, time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			attempts++
			return lockkit.ErrUnavailable
		},
		Release: func(context.Context) error { return nil }})
	<-lease.Lost()
	if lost := time.Since(start); lost < ttl {
		t.Fatalf("lost after %v, before its %v deadline", lost, ttl)
	}
	mu.Lock()
	defer mu.Unlock()
	if attempts < 2 {
		t.Fatalf("%d renewal attempts before the deadline, want a retry", attempts)
	}
}

func TestGoneClosesLost(t *testing.T) {
	gone := make(chan struct{})
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: time.Minute, Gone: gone,
		Extend:  func(context.Context, time.Duration) error { return nil },
		Release: func(context.Context) error { return nil }})
	close(gone)
	select {
	case <-lease.Lost():
	case <-time.After(time.Second):
		t.Fatal("Gone closed, Lost still open")
	}
}

// A grant whose deadline passed before it reached the caller is lost from
// the start: nobody may act on it.
func TestGrantPastItsDeadlineIsLostAtOnce(t *testing.T) {
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: 10 * time.Millisecond, Sent: time.Now().Add(-time.Second),
		Extend:  func(context.Context, time.Duration) error { return nil },
		Release: func(context.Context) error { return nil }})
	if !backend.IsClosed(lease.Lost()) {
		t.Fatal("a grant already past its deadline has Lost open")
	}
}

func TestClosedStopsTheWatchdog(t *testing.T) {
	const ttl = 150 * time.Millisecond
	closedCh := make(chan struct{})
	close(closedCh)
	var mu sync.Mutex
	renewals := 0
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: ttl, Watchdog: true, Closed: closedCh,
		Extend: func(context.Context, time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			renewals++
			return nil
		},
		Release: func(context.Context) error { return nil }})
	<-lease.Lost() // by its TTL, unrenewed
	mu.Lock()
	defer mu.Unlock()
	if renewals != 0 {
		t.Fatalf("%d renewals after the Locker closed", renewals)
	}
}

// A lease with an explicit TTL is never renewed: it is trusted until its
// deadline, Sent+TTL, and not a moment longer.
func TestLeaseWithoutWatchdogIsLostAtItsDeadline(t *testing.T) {
	const ttl = 100 * time.Millisecond
	var renewals atomic.Int32
	start := time.Now()
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: ttl, Sent: start,
		Extend:  func(context.Context, time.Duration) error { renewals.Add(1); return nil },
		Release: func(context.Context) error { return nil }})
	<-lease.Lost()
	if lost := time.Since(start); lost < ttl || lost > ttl+500*time.Millisecond {
		t.Fatalf("lost after %v, want at its %v deadline", lost, ttl)
	}
	if n := renewals.Load(); n != 0 {
		t.Fatalf("%d renewals of a lease with an explicit TTL", n)
	}
	if err := lease.Extend(context.Background(), ttl); !errors.Is(err, lockkit.ErrLeaseLost) {
		t.Fatalf("Extend after the deadline = %v, want ErrLeaseLost", err)
	}
}

// An Extend the store accepted moves the deadline to its send time plus
// the new TTL.
func TestExtendMovesTheDeadline(t *testing.T) {
	const ttl = 100 * time.Millisecond
	start := time.Now()
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: ttl, Sent: start,
		Extend:  func(context.Context, time.Duration) error { return nil },
		Release: func(context.Context) error { return nil }})
	if err := lease.Extend(context.Background(), 3*ttl); err != nil {
		t.Fatal(err)
	}
	<-lease.Lost()
	if lost := time.Since(start); lost < 3*ttl {
		t.Fatalf("lost after %v, before the extended %v", lost, 3*ttl)
	}
}

// An Extend the store refused as not ours loses the lease at once.
func TestExtendNotHeldLosesTheLease(t *testing.T) {
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: time.Minute,
		Extend:  func(context.Context, time.Duration) error { return lockkit.ErrNotHeld },
		Release: func(context.Context) error { return nil }})
	if err := lease.Extend(context.Background(), time.Minute); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("Extend = %v, want ErrNotHeld", err)
	}
	if !backend.IsClosed(lease.Lost()) {
		t.Fatal("Lost open after the store said the grant is not ours")
	}
}

// Release passes the store's answer on, closes Lost, and leaves nothing
// running: not the expiry, not the watchdog, not the Gone watcher.
func TestReleaseEndsEverythingTheLeaseRan(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const ttl = 60 * time.Millisecond
	var renewals, releases atomic.Int32
	lease := backend.NewLease(backend.Grant{Key: "k", Fence: 7, TTL: ttl, Watchdog: true, Gone: make(chan struct{}),
		Extend:  func(context.Context, time.Duration) error { renewals.Add(1); return nil },
		Release: func(context.Context) error { releases.Add(1); return lockkit.ErrNotHeld }})
	if lease.Key() != "k" || lease.Fence() != 7 {
		t.Fatalf("lease of %q fence %d, want the grant's", lease.Key(), lease.Fence())
	}
	if err := lease.Release(context.Background()); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("Release = %v, want the store's ErrNotHeld", err)
	}
	if !backend.IsClosed(lease.Lost()) {
		t.Fatal("Lost open after Release")
	}
	time.Sleep(2 * ttl)
	if n := renewals.Load(); n != 0 {
		t.Fatalf("%d renewals after Release", n)
	}
	if n := releases.Load(); n != 1 {
		t.Fatalf("the store got %d releases, want 1", n)
	}
}

// Nobody watched the lease until after its deadline: Lost, first asked for
// then, is closed already when it returns. A check made at release time
// (the instrument wrapper counts lost leases that way) must see it, with no timer
// left to run first.
func TestLostFirstAskedAfterTheDeadlineIsClosed(t *testing.T) {
	const ttl = 20 * time.Millisecond
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: ttl, Sent: time.Now(),
		Extend:  func(context.Context, time.Duration) error { return nil },
		Release: func(context.Context) error { return nil }})
	time.Sleep(2 * ttl)
	select {
	case <-lease.Lost():
	default:
		t.Fatal("Lost is open after the deadline")
	}
}

// Only the store's answer settles a release: one that failed on the way
// is asked again, and ErrNotHeld comes from the store, never from the
// lease's own bookkeeping.
func TestReleaseThatFailedAsksTheStoreAgain(t *testing.T) {
	var calls atomic.Int32
	unreachable := errors.New("connection reset")
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: time.Minute,
		Extend: func(context.Context, time.Duration) error { return nil },
		Release: func(context.Context) error {
			if calls.Add(1) == 1 {
				return unreachable
			}
			return nil
		}})
	if err := lease.Release(context.Background()); !errors.Is(err, unreachable) {
		t.Fatalf("first Release = %v, want the store's failure", err)
	}
	if !backend.IsClosed(lease.Lost()) {
		t.Fatal("Lost open after a Release was sent: the store may have freed the key")
	}
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("second Release = %v, want nil from the store", err)
	}
	if err := lease.Release(context.Background()); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("third Release = %v, want ErrNotHeld", err)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("store asked %d times, want 2", n)
	}
}

// A lease whose TTL has run out reads as lost the first time anyone looks
// at Lost, even if nobody looked before: callers check it with a select
// and a default (lockkit.Do after fn, Reentrant before nesting) and must
// not be told a dead lease is still trusted.
func TestLostClosedWhenFirstAskedAfterDeadline(t *testing.T) {
	for range 20 {
		l := backend.NewLease(backend.Grant{
			Key: "k", Fence: 1, TTL: 10 * time.Millisecond,
			Extend:  func(context.Context, time.Duration) error { return nil },
			Release: func(context.Context) error { return nil },
		})
		time.Sleep(30 * time.Millisecond)
		if !backend.IsClosed(l.Lost()) {
			t.Fatal("Lost still open 20ms past the lease's deadline")
		}
	}
}

// The goroutine that watches a grant's Gone ends when the lease's TTL runs
// out, also for a lease nobody releases or watches (a session-long Gone,
// as zklock and etcdlock pass, would otherwise keep one per lease alive).
func TestGoneWatcherEndsAtDeadline(t *testing.T) {
	gone := make(chan struct{})
	defer close(gone)
	time.Sleep(10 * time.Millisecond)
	before := runtime.NumGoroutine()
	for range 10 {
		backend.NewLease(backend.Grant{
			Key: "k", Fence: 1, TTL: 10 * time.Millisecond, Gone: gone,
			Extend:  func(context.Context, time.Duration) error { return nil },
			Release: func(context.Context) error { return nil },
		})
	}
	time.Sleep(100 * time.Millisecond)
	if n := runtime.NumGoroutine(); n > before {
		t.Errorf("%d goroutines 90ms after 10 leases ran out, %d before", n, before)
	}
}

// deadline is when lease's Lost closes unless a renewal moves it.
func deadline(t *testing.T, lease lockkit.Lease) time.Time {
	t.Helper()
	d, ok := lease.(interface{ Deadline() time.Time })
	if !ok {
		t.Fatalf("%T reports no deadline", lease)
	}
	return d.Deadline()
}

// A store whose clock may run fast (Redlock's drift) is trusted for the TTL
// less its allowance, on the grant and on every Extend alike (the
// watchdog's renewals settle as Extend does).
func TestDriftIsChargedOnEveryDeadline(t *testing.T) {
	const ttl = 4 * time.Second
	drift := func(ttl time.Duration) time.Duration { return ttl / 100 }
	sent := time.Now()
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: ttl, Sent: sent, Drift: drift,
		Extend:  func(context.Context, time.Duration) error { return nil },
		Release: func(context.Context) error { return nil }})
	defer lease.Release(context.Background())
	if got, want := deadline(t, lease), sent.Add(ttl-ttl/100); !got.Equal(want) {
		t.Errorf("grant's deadline %v after its send, want %v", got.Sub(sent), want.Sub(sent))
	}
	if err := lease.Extend(context.Background(), ttl); err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	if got, limit := deadline(t, lease), answered.Add(ttl-ttl/100); got.After(limit) {
		t.Errorf("Extend's deadline %v after its answer, want at most %v", got.Sub(answered), ttl-ttl/100)
	}
}

// A TTL longer than the store keeps is capped: sent to the store and
// trusted as the store's maximum, never as asked.
func TestExtendBeyondTheStoresMaximumIsCapped(t *testing.T) {
	const maxTTL = time.Hour
	var asked time.Duration
	lease := backend.NewLease(backend.Grant{Key: "k", TTL: 10 * maxTTL, MaxTTL: maxTTL,
		Extend:  func(_ context.Context, ttl time.Duration) error { asked = ttl; return nil },
		Release: func(context.Context) error { return nil }})
	defer lease.Release(context.Background())
	if got, limit := deadline(t, lease), time.Now().Add(maxTTL); got.After(limit) {
		t.Errorf("grant of 10h on a store that keeps 1h trusted until %v from now", time.Until(got))
	}
	if err := lease.Extend(context.Background(), 40*maxTTL); err != nil {
		t.Fatal(err)
	}
	answered := time.Now()
	if asked != maxTTL {
		t.Errorf("store asked to keep the lease %v, want its maximum %v", asked, maxTTL)
	}
	if got, limit := deadline(t, lease), answered.Add(maxTTL); got.After(limit) {
		t.Errorf("Extend(40h) on a store that keeps 1h trusted for %v", got.Sub(answered))
	}
}
