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

type extension struct {
	sent time.Time
	ttl  time.Duration
}

type lease struct {
	g Grant

	lost     chan struct{}
	lostOnce sync.Once
	stop     chan struct{} // closed by Release: the keeper goroutine ends
	done     chan struct{} // closed when the keeper goroutine has ended
	extended chan extension

	mu       sync.Mutex
	released bool
}

// NewLease wraps a grant. It starts one goroutine that renews the lease (with
// Watchdog) or closes Lost at its deadline (without), and that ends when the
// lease is released, lost, or the Locker closes.
func NewLease(g Grant) Lease {
	if g.Sent.IsZero() {
		g.Sent = time.Now()
	}
	l := &lease{
		g:        g,
		lost:     make(chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		extended: make(chan extension, 1),
	}
	go l.keep()
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

// keep is the lease's only goroutine.
func (l *lease) keep() {
	defer close(l.done)
	defer l.markLost()

	ttl := l.g.TTL
	deadline := l.g.Sent.Add(ttl)
	expiry := time.NewTimer(time.Until(deadline))
	defer expiry.Stop()
	var renew <-chan time.Time
	if l.g.Watchdog {
		ticker := time.NewTicker(ttl / 3)
		defer ticker.Stop()
		renew = ticker.C
	}
	for {
		select {
		case <-l.stop:
			return
		case <-l.g.Closed:
			return
		case <-l.g.Gone:
			return
		case <-expiry.C:
			// The store may still hold it, but past this instant another
			// owner may hold it too: the lease can no longer be trusted.
			return
		case ext := <-l.extended:
			ttl = ext.ttl
			deadline = ext.sent.Add(ttl)
			expiry.Reset(time.Until(deadline))
		case <-renew:
			sent := time.Now()
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			err := l.g.Extend(ctx, ttl)
			cancel()
			switch {
			case err == nil:
				deadline = sent.Add(ttl)
				expiry.Reset(time.Until(deadline))
			case errors.Is(err, ErrNotHeld):
				return
			}
			// Any other error is transient: try again at the next tick;
			// the expiry timer ends the lease if no renewal succeeds in time.
		}
	}
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
	select {
	case l.extended <- extension{sent, ttl}:
	default:
		// A newer extension is already queued; the keeper takes one, and
		// both deadlines are within one round trip of each other.
	}
	return nil
}

func (l *lease) Release(ctx context.Context) error {
	l.mu.Lock()
	if l.released {
		l.mu.Unlock()
		return ErrNotHeld
	}
	l.released = true
	l.mu.Unlock()

	close(l.stop)
	<-l.done // the watchdog must not renew what we are about to free
	return l.g.Release(ctx)
}
