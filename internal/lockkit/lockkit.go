// Package lockkit is one small API for distributed locks over many stores.
//
// A Locker grants Leases on string keys. A Lease is exclusive while it is
// valid, expires by itself (TTL) so a crashed holder never blocks others for
// ever, carries a fencing token that a later grant of the same key beats, and
// says through Lost when it can no longer be trusted. Backends differ in what
// they can promise; each declares it in Capabilities, and the conformance
// suite in lockkit/locktest holds every backend to what it declares.
//
// This package is what callers use. Backends are built from
// lockkit/backend, which callers never need, as database drivers are built
// from database/sql/driver.
package lockkit

import (
	"context"
	"errors"
	"time"
)

// Errors every backend returns for the same situations, so callers can match
// them with errors.Is whatever store is behind the Locker.
var (
	// ErrNotAcquired means the key is held by someone else: TryAcquire
	// returns it at once, Acquire when its wait timeout ran out. A backend
	// that can be refused while nobody holds the key says so in an error
	// of its own that wraps this one (Redlock's ErrSplitVote, when
	// contenders split the masters' votes); Acquire retries that case
	// within its wait.
	ErrNotAcquired = errors.New("lockkit: lock not acquired")
	// ErrNotHeld means a Release or Extend found that the caller no longer
	// owns the key (it expired, or was never granted to this owner). Nothing
	// was changed.
	ErrNotHeld = errors.New("lockkit: lock not held by this owner")
	// ErrLeaseLost is returned by Do when fn returned nil after its lease
	// was lost (fn's work ran partly unlocked) or when the lease was lost
	// before fn could run, and by Extend once Lost has closed.
	ErrLeaseLost = errors.New("lockkit: lease lost")
	// ErrFenced is returned by fenced stores when a write carries a fencing
	// token older than one already applied: a stale holder tried to write.
	ErrFenced = errors.New("lockkit: write refused: stale fencing token")
	// ErrUnfenced is returned by DoFenced and DoManyFenced, before any lock
	// is taken, when asked WithoutFence: a store that checks the fence must
	// not be handed a grant that skipped it.
	ErrUnfenced = errors.New("lockkit: a fenced store was given an unfenced grant")
	// ErrUnavailable wraps failures to reach the lock server, so that
	// callers can answer 503 instead of 500.
	ErrUnavailable = errors.New("lockkit: lock server unavailable")
	// ErrClosed is returned by a Locker after Close.
	ErrClosed = errors.New("lockkit: locker closed")
)

// DefaultLeaseTTL is the lease length when no TTL option is given. Such a
// lease is renewed by a watchdog every DefaultLeaseTTL/3 while the holder
// lives, as Redisson does.
const DefaultLeaseTTL = 30 * time.Second

// Locker grants leases on keys. Implementations are safe for concurrent use.
type Locker interface {
	// Acquire waits until the key is granted, ctx is done (ctx.Err()), or
	// the wait timeout option runs out (ErrNotAcquired).
	Acquire(ctx context.Context, key string, opts ...Option) (Lease, error)
	// TryAcquire makes one attempt and returns ErrNotAcquired at once if
	// the key is held.
	TryAcquire(ctx context.Context, key string, opts ...Option) (Lease, error)
	// Close stops background work (watchdogs, subscriptions). Leases still
	// held end by their TTL on TTL backends, and at once on session
	// backends (ZooKeeper, etcd), whose session Close ends.
	Close() error
}

// Lease is one grant of one key.
type Lease interface {
	// Key is the key as the caller passed it.
	Key() string
	// Fence is the fencing token of this grant: strictly greater than the
	// token of every earlier grant of the same key. 0 means the backend
	// cannot fence (Capabilities.Fencing is false).
	Fence() uint64
	// Lost is closed once the lease can no longer be trusted: the watchdog
	// found it gone or could not renew it before it would expire, its TTL
	// ran out, or it was released.
	Lost() <-chan struct{}
	// Extend sets the remaining lease to ttl, if the caller still owns it;
	// otherwise it returns ErrNotHeld and closes Lost. Once Lost has
	// closed it returns ErrLeaseLost.
	Extend(ctx context.Context, ttl time.Duration) error
	// Release frees the key if the caller still owns it. It never frees
	// another holder's grant: then it returns ErrNotHeld and changes
	// nothing. A Release the store did not answer (ErrUnavailable, ctx
	// ended) may be called again; once one succeeded, it returns
	// ErrNotHeld.
	Release(ctx context.Context) error
}

// Capabilities is what a backend can promise. The conformance suite tests
// each promise made and checks that each one not made is really absent, so
// a table of backends can be filled from what was proven.
type Capabilities struct {
	Fencing      bool // Fence() > 0 and strictly increasing per key
	WaitNoPoll   bool // waiters wake on release (pub/sub, watch, row lock), not on a timer
	Fair         bool // waiters are granted in arrival order, across processes; no newcomer goes first
	LostSignal   bool // Lost() closes when the lease is taken away behind the holder's back
	Reentrant    bool // the same owner (WithOwner) may acquire a key it holds
	Expires      bool // a lease ends by itself when its holder dies
	OwnerCheck   bool // release and extend are refused to a non-owner
	CrossProcess bool // exclusion holds between processes, not only goroutines
}

// Describer is implemented by backends that declare their Capabilities.
type Describer interface {
	Capabilities() Capabilities
}

// CapabilitiesOf returns what l declares; a Locker that declares nothing
// promises nothing. Wrappers pass their inner Locker's declaration on
// through it.
func CapabilitiesOf(l Locker) Capabilities {
	if d, ok := l.(Describer); ok {
		return d.Capabilities()
	}
	return Capabilities{}
}
