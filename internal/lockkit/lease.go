package lockkit

import (
	"context"
	"errors"
	"sync"
	"time"
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
	// return ErrNotHeld when the grant is no longer this owner's.
	Extend  func(ctx context.Context, ttl time.Duration) error
	Release func(ctx context.Context) error
	// Gone, if not nil, is closed by the backend when it learns the grant
	// ended by itself (session expired, connection died).
	Gone <-chan struct{}
	// Closed is the Locker's shutdown signal: the watchdog stops with it.
	Closed <-chan struct{}
}

// lease runs on timers rather than a goroutine of its own: an uncontended
// acquire+release cycle should cost two round trips and nothing else.
type lease struct {
	g Grant

	lost     chan struct{}
	lostOnce sync.Once

	mu       sync.Mutex
	ttl      time.Duration
	deadline time.Time   // Lost closes here unless a renewal moves it
	expiry   *time.Timer // fires at deadline
	renewal  *time.Timer // the watchdog's next renewal, if any
	renewing chan struct{}
	released bool
}

// NewLease wraps a grant. The lease closes Lost at its deadline, renews
// itself every TTL/3 with Watchdog, and stops both when released.
func NewLease(g Grant) Lease {
	if g.Sent.IsZero() {
		g.Sent = time.Now()
	}
	l := &lease{g: g, lost: make(chan struct{}), ttl: g.TTL, deadline: g.Sent.Add(g.TTL)}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.expiry = time.AfterFunc(time.Until(l.deadline), l.markLost)
	if g.Watchdog {
		l.renewal = time.AfterFunc(g.TTL/3, l.renew)
	}
	if g.Gone != nil {
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

func (l *lease) Key() string           { return l.g.Key }
func (l *lease) Fence() uint64         { return l.g.Fence }
func (l *lease) Lost() <-chan struct{} { return l.lost }

func (l *lease) markLost() { l.lostOnce.Do(func() { close(l.lost) }) }

func (l *lease) isLost() bool {
	select {
	case <-l.lost:
		return true
	default:
		return false
	}
}

// renew is the watchdog's tick, run by its timer.
func (l *lease) renew() {
	l.mu.Lock()
	if l.released || l.isLost() || closedChan(l.g.Closed) {
		l.mu.Unlock()
		return
	}
	done := make(chan struct{})
	l.renewing = done
	ttl, deadline := l.ttl, l.deadline
	l.mu.Unlock()

	sent := time.Now()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	err := l.g.Extend(ctx, ttl)
	cancel()

	l.mu.Lock()
	defer l.mu.Unlock()
	defer close(done)
	l.renewing = nil
	switch {
	case err == nil:
		l.moveDeadline(sent.Add(ttl))
	case errors.Is(err, ErrNotHeld):
		l.markLost()
		return
	}
	// Any other error is transient: try again at the next tick; the expiry
	// timer ends the lease if no renewal succeeds in time.
	if !l.released {
		l.renewal.Reset(ttl / 3)
	}
}

// moveDeadline is called with l.mu held.
func (l *lease) moveDeadline(deadline time.Time) {
	if l.isLost() {
		return // a deadline already passed: trust cannot come back
	}
	l.deadline = deadline
	l.expiry.Reset(time.Until(deadline))
}

func (l *lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l.isLost() {
		return ErrLeaseLost
	}
	sent := time.Now()
	err := l.g.Extend(ctx, ttl)
	if errors.Is(err, ErrNotHeld) {
		l.markLost()
		return err
	}
	if err != nil {
		return err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ttl = ttl
	l.moveDeadline(sent.Add(ttl))
	return nil
}

func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return ErrNotHeld
	}
	l.released = true
	if l.renewal != nil {
		l.renewal.Stop()
	}
	renewing := l.renewing
	l.mu.Unlock()
	if renewing != nil {
		<-renewing // a renewal in flight must not re-extend what we free
	}

	err := l.g.Release(ctx)
	l.mu.Lock()
	l.expiry.Stop()
	l.mu.Unlock()
	l.markLost()
	return err
}

func closedChan(ch <-chan struct{}) bool {
	if ch == nil {
		return false
	}
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
