package backend

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// Grant is what a backend knows about one successful acquisition. NewLease
// turns it into a Lease, so that the watchdog, the Lost signal and the local
// expiry behave the same on every backend.
type Grant struct {
	Key   string
	Fence uint64
	TTL   time.Duration
	// Watchdog renews the lease every TTL/3 until it is released.
	Watchdog bool
	// Sent is when the acquire request left this process. The server's TTL
	// started later than that, so Sent+TTL is a deadline that is never late
	// on the holder's clock, whatever the network delay was.
	Sent time.Time
	// Extend and Release are owner-checked operations on the store; they
	// return lockkit.ErrNotHeld when the grant is no longer this owner's.
	Extend  func(ctx context.Context, ttl time.Duration) error
	Release func(ctx context.Context) error
	// Gone, if not nil, is closed by the backend when it learns the grant
	// ended by itself (session expired, connection died).
	Gone <-chan struct{}
	// Closed is the Locker's shutdown signal: the watchdog stops with it.
	Closed <-chan struct{}
	// Drift, if not nil, is the part of a TTL the store's clock may take
	// from ours (Redlock charges 1 %): the grant's deadline and every
	// renewal's are the send time plus the TTL less Drift(TTL).
	Drift func(ttl time.Duration) time.Duration
	// MaxTTL, if set, is the longest TTL the store keeps (memcached's 30
	// days, MariaDB's wait_timeout of 365). A longer TTL, the grant's or
	// an Extend's, is capped to it: sent to the store and trusted capped,
	// never as asked.
	MaxTTL time.Duration
}

// lease runs on timers rather than a goroutine of its own, and arms its
// expiry timer only once somebody asks for Lost: an uncontended
// acquire+release cycle should cost two round trips and nothing else (a
// timer armed and stopped per cycle wakes the runtime's poller twice).
type lease struct {
	g Grant

	lost     chan struct{}
	lostOnce sync.Once

	// calls lets one Extend or renewal talk to the store at a time. The
	// store keeps the TTL it applied last and the lease the deadline whose
	// reply it processed last; only one request in flight makes them the
	// same request.
	calls chan struct{}

	mu       sync.Mutex
	ttl      time.Duration
	deadline time.Time   // Lost closes here unless a renewal moves it
	expiry   *time.Timer // fires at deadline; nil until Lost is asked for
	renewal  *time.Timer // the watchdog's next renewal, if any
	released bool
	// cancelRenewal ends the renewal in flight, if any: Release calls it.
	cancelRenewal context.CancelFunc
}

// NewLease wraps a grant. The lease closes Lost at its deadline, renews
// itself every TTL/3 with Watchdog, and stops both when released. A grant
// already past its deadline is lost from the start.
func NewLease(g Grant) lockkit.Lease {
	if g.Sent.IsZero() {
		g.Sent = time.Now()
	}
	l := &lease{g: g, lost: make(chan struct{}), calls: make(chan struct{}, 1)}
	l.ttl = l.capped(g.TTL)
	l.deadline = l.until(g.Sent, l.ttl)
	l.mu.Lock()
	defer l.mu.Unlock()
	if !time.Now().Before(l.deadline) {
		l.markLost()
	}
	if g.Watchdog {
		l.renewal = time.AfterFunc(l.ttl/3, l.renew)
	}
	if g.Gone != nil {
		// The watcher below ends when Lost closes: at the deadline at the
		// latest, so the expiry timer runs from the start.
		l.expiry = time.AfterFunc(time.Until(l.deadline), l.markLost)
		go func() {
			select {
			case <-g.Gone:
				l.markLost()
			case <-l.lost:
			}
		}()
	}
	return l
}

func (l *lease) Key() string   { return l.g.Key }
func (l *lease) Fence() uint64 { return l.g.Fence }

// Deadline is when Lost closes unless a renewal moves it first: what the
// lease trusts the store to keep, for tests and operators to check.
func (l *lease) Deadline() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.deadline
}

// capped is ttl within what the store keeps.
func (l *lease) capped(ttl time.Duration) time.Duration {
	if l.g.MaxTTL > 0 {
		return min(ttl, l.g.MaxTTL)
	}
	return ttl
}

// until is the deadline of a TTL the store was sent at sent.
func (l *lease) until(sent time.Time, ttl time.Duration) time.Time {
	if l.g.Drift != nil {
		ttl -= l.g.Drift(ttl)
	}
	return sent.Add(ttl)
}

func (l *lease) Lost() <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	// isLost closes a lease past its deadline now: a timer would close it
	// only after the caller had looked.
	if !l.isLost() && l.expiry == nil {
		l.expiry = time.AfterFunc(time.Until(l.deadline), l.markLost)
	}
	return l.lost
}

func (l *lease) lostNow() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.isLost()
}

func (l *lease) markLost() { l.lostOnce.Do(func() { close(l.lost) }) }

// isLost also reads the clock: nobody may have armed the expiry timer. It
// is called with l.mu held.
func (l *lease) isLost() bool {
	if IsClosed(l.lost) {
		return true
	}
	if !time.Now().Before(l.deadline) {
		l.markLost()
		return true
	}
	return false
}

// renew is the watchdog's tick, run by its timer.
func (l *lease) renew() {
	select {
	case l.calls <- struct{}{}:
	case <-l.lost: // released or expired while an Extend ran
		return
	}
	defer func() { <-l.calls }()
	l.mu.Lock()
	if l.released || l.isLost() || IsClosed(l.g.Closed) {
		l.mu.Unlock()
		return
	}
	ttl, deadline := l.ttl, l.deadline
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	l.cancelRenewal = cancel
	l.mu.Unlock()

	sent := time.Now()
	err := l.g.Extend(ctx, ttl)
	cancel()

	l.mu.Lock()
	defer l.mu.Unlock()
	l.cancelRenewal = nil
	l.settle(sent, ttl, err)
	// After a transient error, try again at the next tick; the expiry
	// timer ends the lease if no renewal succeeds in time.
	if !l.released && !l.isLost() {
		l.renewal.Reset(l.ttl / 3)
	}
}

// settle records the outcome of a store Extend of ttl sent at sent. It is
// called with l.mu held.
func (l *lease) settle(sent time.Time, ttl time.Duration, err error) {
	switch {
	case err == nil:
		l.ttl = ttl
		l.moveDeadline(l.until(sent, ttl))
	case errors.Is(err, lockkit.ErrNotHeld):
		l.markLost()
	default:
		// No reply: the store may or may not have applied ttl, so
		// trust the earlier of the two deadlines it may be keeping.
		if d := l.until(sent, ttl); d.Before(l.deadline) {
			l.moveDeadline(d)
		}
	}
}

// moveDeadline is called with l.mu held.
func (l *lease) moveDeadline(deadline time.Time) {
	if l.isLost() {
		return // a deadline already passed: trust cannot come back
	}
	l.deadline = deadline
	if l.expiry != nil {
		l.expiry.Reset(time.Until(deadline))
	}
}

func (l *lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l.lostNow() {
		return lockkit.ErrLeaseLost
	}
	select {
	case l.calls <- struct{}{}:
	case <-l.lost:
		return lockkit.ErrLeaseLost
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-l.calls }()
	if l.lostNow() {
		return lockkit.ErrLeaseLost
	}
	ttl = l.capped(ttl)
	sent := time.Now()
	err := l.g.Extend(ctx, ttl)
	l.mu.Lock()
	defer l.mu.Unlock()
	l.settle(sent, ttl, err)
	return err
}

// Release does not wait for a renewal in flight: the store's extend is
// owner-checked, so a renewal that lands after the release finds nothing
// of this owner's to extend. Trust ends as the release leaves: the store
// may free the key at any moment from then on. A release the store did not
// answer (its ctx ended, the connection failed) may be tried again: only
// the store's answer, freed or not held, settles it.
func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return lockkit.ErrNotHeld
	}
	if l.renewal != nil {
		l.renewal.Stop()
	}
	if l.expiry != nil {
		l.expiry.Stop()
	}
	if l.cancelRenewal != nil {
		l.cancelRenewal()
	}
	l.mu.Unlock()
	l.markLost()
	err := l.g.Release(ctx)
	if err == nil || errors.Is(err, lockkit.ErrNotHeld) {
		l.mu.Lock()
		l.released = true
		l.mu.Unlock()
	}
	return err
}
