// Package memcachedlock is the lockkit backend on memcached: a lock is an
// item created with add (which fails while the item exists), holding a random
// owner token, with an expiry.
//
// Release and Extend are owner-checked with a CAS: get the item and its CAS
// id, compare the token, then cas the item with a new expiry (Extend) or
// with a negative one (Release). memcached has no conditional delete in its
// text protocol, but an item swapped in already expired is gone for every
// later get and add: a delete that fails if anyone changed the item since
// the get. Touch is never used: it is not owner-checked.
//
// What memcached cannot promise, and Capabilities declares:
//
//   - Fencing: Fence() is 0. A counter kept in memcached can be evicted or
//     lost with a restart, after which incr starts again lower: a token could
//     go backwards, the one thing a fence must never do.
//   - Waiting without polling: Acquire retries add with a random delay.
//     Only one waiter per Locker and key does (backend.Line): the others
//     wait in line in the process, and a release through the same Locker
//     hands the key to the next in line at once.
//   - Durability: memcached is a cache. An item evicted under memory
//     pressure, or lost with a restart, frees the lock while its holder
//     still believes it holds it; the holder's watchdog notices at its next
//     renewal at the earliest. Give locks an instance (or a slab class) that
//     never runs full, and use this backend where an occasional double grant
//     costs duplicated work, not money.
//
// Time: memcached counts expiry in whole seconds on a clock that ticks once a
// second, so an item given n seconds lives between n-1 and n. A lease is
// therefore rounded up to whole seconds (at least 1 s), the item is given one
// second more than the lease, and the lease's Lost closes on the client's
// clock when the rounded lease runs out: the item always outlives the lease
// that Lost describes. A crashed holder's lock frees up to 2 s after its lease.
package memcachedlock

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/bradfitz/gomemcache/memcache"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// maxLease is memcached's longest relative expiry (30 days, less the extra
// second the item gets); a longer expiry would be read as a Unix time. A
// longer TTL, asked of Acquire or Extend, is capped to it, and the lease
// trusts no more than that.
const maxLease = 30*24*time.Hour - time.Second

// outage is how many attempts running must fail to reach the server before
// Acquire reports ErrUnavailable instead of waiting on.
const outage = 3

// Locker grants leases held as memcached items.
type Locker struct {
	mc       *memcache.Client
	minDelay time.Duration
	maxDelay time.Duration
	line     backend.Line
	// background runs the calls whose callers did not wait for them; its
	// Done is the Locker's shutdown signal.
	background backend.Group
}

// Option configures a Locker.
type Option func(*Locker)

// WithRetryDelay sets the range [lo, hi] of the random pause between two
// attempts of the one waiter per Locker and key that polls (default 2 ms
// to 10 ms). The server then sees one poller per process and contended
// key, about 170 adds a second at the default, what five waiters cost when
// each polled every 10-50 ms. hi also bounds how long a waiter in another
// process waits to notice a release: a Locker whose line never empties
// lets the key go for hi every backend.HandOffRun hand-offs.
func WithRetryDelay(lo, hi time.Duration) Option {
	return func(l *Locker) { l.minDelay, l.maxDelay = lo, max(lo, hi) }
}

// New returns a Locker over client, which it never closes. gomemcache takes
// no context: each call to the server is bounded by client.Timeout (500 ms
// by default). Acquire, TryAcquire, Extend and Release run their calls in a
// goroutine and return when their ctx ends; the calls then finish in the
// background and Close waits for them. With several servers the client
// picks one per key, so a lock is only as available as that server.
func New(client *memcache.Client, opts ...Option) *Locker {
	l := &Locker{mc: client, minDelay: 2 * time.Millisecond, maxDelay: 10 * time.Millisecond}
	for _, opt := range opts {
		opt(l)
	}
	return l
}

// Capabilities of memcached: no fencing tokens, waiters poll.
func (l *Locker) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{LostSignal: true, Expires: true, OwnerCheck: true, CrossProcess: true}
}

// Acquire waits in the Locker's line for key, and polls with add once it
// is first, until add succeeds, the wait timeout runs out or ctx is done.
// It returns ErrUnavailable when the server failed outage attempts
// running, to the poller and to everyone in line behind it.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, watchdog := backend.Resolve(opts)
	poller := backend.Poller{MinDelay: l.minDelay, MaxDelay: l.maxDelay, Outage: outage, Closed: l.background.Done(), Line: &l.line, Key: key}
	return poller.Acquire(ctx, o, func(tryCtx context.Context) (lockkit.Lease, error) {
		return l.try(tryCtx, key, o.TTL, watchdog)
	})
}

// TryAcquire makes one add.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o, watchdog := backend.Resolve(opts)
	return l.try(ctx, key, o.TTL, watchdog)
}

func (l *Locker) try(ctx context.Context, key string, ttl time.Duration, watchdog bool) (lockkit.Lease, error) {
	ttl = wholeSeconds(ttl)
	item, token := ItemKey(key), rand.Text()
	sent := time.Now()
	if err := l.add(ctx, item, token, ttl); err != nil {
		return nil, err
	}
	// gets-then-cas by the watchdog, by a caller's Extend and by Release
	// would see each other's cas as a stranger's change: one at a time.
	turn := make(chan struct{}, 1)
	release := &pendingRelease{}
	return backend.NewLease(backend.Grant{
		Key: key, TTL: ttl, Watchdog: watchdog, Sent: sent, MaxTTL: maxLease,
		Extend: func(ctx context.Context, ttl time.Duration) error {
			return l.call(ctx, turn, false, func() error { return l.swap(item, token, expiration(wholeSeconds(ttl))) })
		},
		Release: release.run(func() error {
			return l.call(context.Background(), turn, true, func() error {
				err := l.release(item, token)
				if err == nil {
					l.line.Released(key)
				}
				return err
			})
		}),
		Closed: l.background.Done(),
	}), nil
}

// add stores the lock item in the background and waits for it while ctx
// lasts. An add whose answer was lost may have been applied, and one that
// succeeded after its caller left holds a key nobody uses: both are taken
// back rather than left to block the key for a whole lease.
func (l *Locker) add(ctx context.Context, item, token string, ttl time.Duration) error {
	result := make(chan error) // unbuffered: a send hands the outcome to a caller still waiting
	abandoned := make(chan struct{})
	started := l.background.Go(func() {
		err := l.mc.Add(&memcache.Item{Key: item, Value: []byte(token), Expiration: expiration(ttl)})
		granted := false
		select {
		case result <- err:
			granted = err == nil
		case <-abandoned:
		}
		if !granted && !errors.Is(err, memcache.ErrNotStored) {
			_ = l.release(item, token)
		}
	})
	if !started {
		return lockkit.ErrClosed
	}
	select {
	case err := <-result:
		switch {
		case err == nil:
			return nil
		case errors.Is(err, memcache.ErrNotStored):
			return lockkit.ErrNotAcquired
		default:
			return fmt.Errorf("%w: %w", lockkit.ErrUnavailable, err)
		}
	case <-ctx.Done():
		close(abandoned)
		return ctx.Err()
	}
}

// call runs op, one of a lease's owner-checked operations, in its turn, in
// the background, and waits for it while ctx lasts: on a silent server op
// takes client.Timeout per call, and the watchdog's renewal may hold the
// turn as long. Once ctx ends the caller gets ctx.Err() and op still runs
// if it must (a Release: the caller wants the key freed, whether or not
// it learns when); an Extend whose caller left before its turn does not.
// After Close, op runs on the caller's path.
func (l *Locker) call(ctx context.Context, turn chan struct{}, must bool, op func() error) error {
	if err := ctx.Err(); err != nil && !must {
		return err
	}
	result := make(chan error, 1)
	run := func() {
		turn <- struct{}{}
		defer func() { <-turn }()
		if err := ctx.Err(); err != nil && !must {
			result <- err
			return
		}
		result <- op()
	}
	if !l.background.Go(run) {
		run()
		return <-result
	}
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// release is a delete that happens only if the item still holds token:
// swapped in already expired, the item is gone for every later get and add.
func (l *Locker) release(item, token string) error { return l.swap(item, token, -1) }

// swap sets the item's expiry if it still holds token and nobody changed
// it since the get; otherwise ErrNotHeld, and nothing changed.
func (l *Locker) swap(item, token string, expiration int32) error {
	it, err := l.mc.Get(item)
	if errors.Is(err, memcache.ErrCacheMiss) {
		return lockkit.ErrNotHeld
	}
	if err != nil {
		return fmt.Errorf("%w: %w", lockkit.ErrUnavailable, err)
	}
	if string(it.Value) != token {
		return lockkit.ErrNotHeld
	}
	it.Expiration = expiration
	err = l.mc.CompareAndSwap(it)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, memcache.ErrCASConflict), errors.Is(err, memcache.ErrNotStored), errors.Is(err, memcache.ErrCacheMiss):
		// Changed or expired between our get and our cas: whatever it
		// holds now was granted to someone else.
		return lockkit.ErrNotHeld
	default:
		return fmt.Errorf("%w: %w", lockkit.ErrUnavailable, err)
	}
}

// wholeSeconds rounds a lease up to what memcached can express.
func wholeSeconds(ttl time.Duration) time.Duration {
	ttl = min(ttl, maxLease)
	return max((ttl + time.Second - 1).Truncate(time.Second), time.Second)
}

// expiration is the item's expiry for a lease of whole seconds: one second
// more, because memcached's clock may tick right after the item is stored.
func expiration(lease time.Duration) int32 { return int32(lease/time.Second) + 1 }

// ItemKey is the memcached key that holds key's lock: key itself when it is
// a legal memcached key (at most 250 bytes, no spaces or control
// characters), else a hash of it. Operators and tests use it to inspect or
// delete a lock.
func ItemKey(key string) string {
	legal := len(key) <= 250
	for i := 0; legal && i < len(key); i++ {
		legal = key[i] > ' ' && key[i] != 0x7f
	}
	if legal {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// Close stops every lease's watchdog; waiters get ErrClosed. It returns
// once the calls its callers left behind have finished: on a silent server
// up to four client timeouts (a Release waits for a renewal's gets and cas,
// then makes its own). Leases still held expire by their TTL; the client
// stays open.
func (l *Locker) Close() error {
	l.background.Stop()
	l.background.Wait()
	return nil
}

// pendingRelease is a lease's Release that goes on after its caller left
// (the key should be freed whether or not the caller learns when). A retry
// waits for that release's answer instead of asking the server again,
// which, once the release has run, would say the item is not held.
type pendingRelease struct {
	mu   sync.Mutex
	done chan struct{} // nil: no release under way, or the last one failed
	err  error
}

// run returns a Release that starts op at most once at a time, and waits
// for it while its caller's ctx lasts. A failed op may be started again.
func (p *pendingRelease) run(op func() error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		p.mu.Lock()
		if p.done == nil {
			done := make(chan struct{})
			p.done = done
			go func() {
				err := op()
				p.mu.Lock()
				p.err = err
				if err != nil && !errors.Is(err, lockkit.ErrNotHeld) {
					p.done = nil
				}
				p.mu.Unlock()
				close(done)
			}()
		}
		done := p.done
		p.mu.Unlock()
		select {
		case <-done:
			p.mu.Lock()
			defer p.mu.Unlock()
			return p.err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
