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
)

// maxLease is memcached's longest relative expiry (30 days, less the extra
// second the item gets); a longer expiry would be read as a Unix time.
const maxLease = 30*24*time.Hour - time.Second

// outage is how many attempts running must fail to reach the server before
// Acquire reports ErrUnavailable instead of waiting on.
const outage = 3

// Locker grants leases held as memcached items.
type Locker struct {
	mc       *memcache.Client
	minDelay time.Duration
	maxDelay time.Duration
	closed   chan struct{}
	once     sync.Once
}

// Option configures a Locker.
type Option func(*Locker)

// WithRetryDelay sets the range [lo, hi] of the random pause between two
// attempts of a waiting Acquire (default 10 ms to 50 ms).
func WithRetryDelay(lo, hi time.Duration) Option {
	return func(l *Locker) { l.minDelay, l.maxDelay = lo, max(lo, hi) }
}

// New returns a Locker over client, which it never closes. gomemcache takes
// no context: each operation is bounded by client.Timeout (500 ms by
// default), and ctx is checked between operations. With several servers the
// client picks one per key, so a lock is only as available as that server.
func New(client *memcache.Client, opts ...Option) *Locker {
	l := &Locker{mc: client, minDelay: 10 * time.Millisecond, maxDelay: 50 * time.Millisecond, closed: make(chan struct{})}
	for _, opt := range opts {
		opt(l)
	}
	return l
}

// Capabilities of memcached: no fencing tokens, waiters poll.
func (l *Locker) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{LostSignal: true, Expires: true, OwnerCheck: true, CrossProcess: true}
}

// Acquire polls until add succeeds, the wait timeout runs out or ctx is
// done. It returns ErrUnavailable when the server failed outage attempts
// running.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, watchdog := lockkit.Resolve(opts)
	poller := lockkit.Poller{MinDelay: l.minDelay, MaxDelay: l.maxDelay, Outage: outage, Closed: l.closed}
	return poller.Acquire(ctx, o, func() (lockkit.Lease, error) { return l.try(key, o.TTL, watchdog) })
}

// TryAcquire makes one add.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o, watchdog := lockkit.Resolve(opts)
	return l.try(key, o.TTL, watchdog)
}

func (l *Locker) try(key string, ttl time.Duration, watchdog bool) (lockkit.Lease, error) {
	select {
	case <-l.closed:
		return nil, lockkit.ErrClosed
	default:
	}
	ttl = wholeSeconds(ttl)
	item, token := ItemKey(key), rand.Text()
	sent := time.Now()
	err := l.mc.Add(&memcache.Item{Key: item, Value: []byte(token), Expiration: expiration(ttl)})
	switch {
	case errors.Is(err, memcache.ErrNotStored):
		return nil, lockkit.ErrNotAcquired
	case err != nil:
		// The add may have been applied with its answer lost; take it back
		// if so, rather than leave the key blocked for a whole lease.
		_ = l.release(item, token)
		return nil, fmt.Errorf("%w: %w", lockkit.ErrUnavailable, err)
	}
	// gets-then-cas by the watchdog and by a caller's Extend would see
	// each other's cas as a stranger's change: one owner, one at a time.
	var mu sync.Mutex
	return lockkit.NewLease(lockkit.Grant{
		Key: key, TTL: ttl, Watchdog: watchdog, Sent: sent,
		Extend: func(ctx context.Context, ttl time.Duration) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			return l.swap(item, token, expiration(wholeSeconds(ttl)))
		},
		Release: func(context.Context) error {
			mu.Lock()
			defer mu.Unlock()
			return l.release(item, token)
		},
		Closed: l.closed,
	}), nil
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

// Close stops every lease's watchdog; waiters get ErrClosed. Leases still
// held expire by their TTL; the client stays open.
func (l *Locker) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}
