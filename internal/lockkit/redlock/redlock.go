// Package redlock is the lockkit backend over N independent Redis masters:
// the Redlock algorithm as github.com/go-redsync/redsync implements it. A
// key is held when a majority of the masters granted it (SET NX PX with a
// random value) within its validity time, so the lock survives the loss of
// a minority of masters, which a single Redis with an asynchronous replica
// does not.
//
// What it cannot do, by design, and says so in Capabilities:
//
//   - Fence: Fence() is 0. Redlock has no counter that a majority agrees
//     on, so it cannot issue tokens that a later grant always beats; a holder
//     paused by GC past its TTL can still write after the next holder
//     (M. Kleppmann, "How to do distributed locking", 2016). Stores that
//     must refuse stale writers need a fencing backend (redis, mysql,
//     zookeeper, etcd).
//   - Wait without polling: Acquire retries with a random delay until the
//     key is granted, the wait timeout runs out or ctx is done. Only one
//     waiter per Locker and key does (backend.Line): the others wait in
//     line in the process, and a release through the same Locker hands the
//     key to the next in line at once.
//
// Its safety rests on timing: the masters' clocks must not jump (no NTP
// steps; Redlock subtracts 1% of the TTL for drift) and a crashed master
// must stay down for a TTL before it rejoins, or run with appendfsync
// always.
package redlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// outage is how many attempts running must fail to reach a majority before
// Acquire reports ErrUnavailable instead of waiting on.
const outage = 3

// splitTries is how many attempts TryAcquire makes while contenders split
// the masters' votes and nobody holds the key.
const splitTries = 4

// ErrSplitVote is returned by TryAcquire when, attempt after attempt,
// contenders split the masters' votes so that none won a majority: nobody
// holds the key, and nobody got it. It wraps lockkit.ErrNotAcquired, so a
// caller that treats a busy key as busy goes on doing so; Acquire never
// returns it, it retries within its wait.
var ErrSplitVote = fmt.Errorf("redlock: contenders split the masters' votes and none won a majority: %w", lockkit.ErrNotAcquired)

// Locker grants leases held on a majority of independent Redis masters.
type Locker struct {
	rs       *redsync.Redsync
	pools    []redsyncredis.Pool
	masters  int
	quorum   int
	minDelay time.Duration
	maxDelay time.Duration
	line     backend.Line
	// background runs the attempts whose callers did not wait for them;
	// its Done is the Locker's shutdown signal.
	background backend.Group
}

// Option configures a Locker.
type Option func(*Locker)

// WithRetryDelay sets the range [lo, hi] of the random pause between two
// attempts of the one waiter per Locker and key that polls (default 2 ms
// to 10 ms). Each master then sees one poller per process and contended
// key, about 170 attempts a second at the default, what five waiters cost
// when each polled every 10-50 ms. Shorter hands a key released by another
// process over sooner and costs the masters more; hi also bounds how long
// a waiter in another process waits to notice a release: a Locker whose
// line never empties lets the key go for hi every backend.HandOffRun
// hand-offs.
func WithRetryDelay(lo, hi time.Duration) Option {
	return func(l *Locker) { l.minDelay, l.maxDelay = lo, max(lo, hi) }
}

// New returns a Locker over clients, one per independent master (an odd
// number, three or five; not a Cluster, not replicas of each other). The
// Locker never closes the clients. Create them with ContextTimeoutEnabled,
// MaxRetries -1 and DialerRetries 1: a master that stops answering then
// costs each operation its timeout (TTL/20, at least 50 ms), not go-redis's
// retries and 3 s read timeout.
func New(clients []redis.UniversalClient, opts ...Option) *Locker {
	if len(clients) == 0 {
		panic("redlock: New needs at least one master")
	}
	pools := make([]redsyncredis.Pool, len(clients))
	for i, c := range clients {
		pools[i] = goredis.NewPool(c)
	}
	l := &Locker{
		rs:       redsync.New(pools...),
		pools:    pools,
		masters:  len(clients),
		quorum:   len(clients)/2 + 1,
		minDelay: 2 * time.Millisecond,
		maxDelay: 10 * time.Millisecond,
	}
	for _, opt := range opts {
		opt(l)
	}
	return l
}

// Capabilities of Redlock: no fencing tokens, waiters poll.
func (l *Locker) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{LostSignal: true, Expires: true, OwnerCheck: true, CrossProcess: true}
}

// Acquire waits in the Locker's line for key, and polls once it is first,
// until a majority grants key. It returns ErrUnavailable, without waiting
// further, once outage attempts running could not reach a majority of the
// masters, to the poller and to everyone in line behind it.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, watchdog := backend.Resolve(opts)
	// Not redsync's own retry loop: it answers ErrFailed when ctx ends and
	// cancels its attempts' clean-up with it; the poller returns ctx.Err()
	// and lets every attempt finish.
	poller := backend.Poller{MinDelay: l.minDelay, MaxDelay: l.maxDelay, Outage: outage, Closed: l.background.Done(), Line: &l.line, Key: key}
	return poller.Acquire(ctx, o, func(tryCtx context.Context) (lockkit.Lease, error) {
		return l.try(tryCtx, key, o.TTL, watchdog)
	})
}

// TryAcquire makes one attempt on every master. An attempt refused while
// no single owner holds a majority (the votes split between contenders) is
// made again after a pause of the retry delay, up to splitTries attempts,
// and then answered with ErrSplitVote: ErrNotAcquired alone says that
// another owner holds the key.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	o, watchdog := backend.Resolve(opts)
	for tries := 1; ; tries++ {
		lease, err := l.try(ctx, key, o.TTL, watchdog)
		if !errors.Is(err, lockkit.ErrNotAcquired) || l.heldByOne(ctx, key, o.TTL) {
			return lease, err
		}
		if tries == splitTries {
			return nil, ErrSplitVote
		}
		pause := time.NewTimer(l.minDelay + rand.N(l.maxDelay-l.minDelay+1))
		select {
		case <-pause.C:
		case <-ctx.Done():
			pause.Stop()
			return nil, ctx.Err()
		}
	}
}

// heldByOne reports whether one owner's value is on a majority of the
// masters. A master that does not answer counts for nobody, so an outage
// reads as a split vote: the next attempt tells it apart.
func (l *Locker) heldByOne(ctx context.Context, key string, ttl time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, opTimeout(ttl))
	defer cancel()
	votes := make(map[string]int, len(l.pools))
	for _, p := range l.pools {
		conn, err := p.Get(ctx)
		if err != nil {
			continue
		}
		value, err := conn.Get(key)
		_ = conn.Close()
		if err == nil && value != "" {
			votes[value]++
		}
	}
	for _, n := range votes {
		if n >= l.quorum {
			return true
		}
	}
	return false
}

func (l *Locker) try(ctx context.Context, key string, ttl time.Duration, watchdog bool) (lockkit.Lease, error) {
	m := l.mutex(key, ttl, "")
	if err := l.lock(ctx, m, ttl); err != nil {
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, ctxErr
		}
		if errors.Is(err, lockkit.ErrClosed) {
			return nil, err
		}
		if down, _ := tally(err); down > l.masters-l.quorum {
			return nil, fmt.Errorf("%w: %w", lockkit.ErrUnavailable, err)
		}
		return nil, lockkit.ErrNotAcquired
	}
	value := m.Value()
	return backend.NewLease(backend.Grant{
		Key: key, TTL: ttl, Watchdog: watchdog,
		// Until is redsync's validity end: the attempt's start plus the TTL
		// minus the clock-drift allowance. Starting the lease at the
		// attempt's start makes the local deadline exactly that, and each
		// renewal is charged the same allowance from its own send.
		Sent:  m.Until().Add(drift(ttl) - ttl),
		Drift: drift,
		// redsync bounds only lock attempts by its timeout factor; these
		// get the same bound, or one silent master holds them until ctx
		// or the client's read timeout ends.
		Extend: func(ctx context.Context, ttl time.Duration) error {
			ctx, cancel := context.WithTimeout(ctx, opTimeout(ttl))
			defer cancel()
			ok, err := l.mutex(key, ttl, value).ExtendContext(ctx)
			return l.ownerErr(ok, err)
		},
		Release: func(ctx context.Context) error {
			ctx, cancel := context.WithTimeout(ctx, opTimeout(ttl))
			defer cancel()
			ok, err := l.mutex(key, ttl, value).UnlockContext(ctx)
			if err := l.ownerErr(ok, err); err != nil {
				return err
			}
			l.line.Released(key)
			return nil
		},
		Closed: l.background.Done(),
	}), nil
}

// lock makes one attempt on the masters in the background and waits for
// it while ctx lasts. The attempt is detached from ctx: a caller giving up
// mid-attempt must not cancel redsync's clean-up of a minority grant, which
// would leave our value on some masters for a whole TTL. Nor may the
// caller wait for it: on silent masters the attempt takes one operation
// timeout for the SETs and another for the clean-up (3 s for a 30 s TTL).
// An attempt that wins a majority after its caller left gives it back.
func (l *Locker) lock(ctx context.Context, m *redsync.Mutex, ttl time.Duration) error {
	result := make(chan error) // unbuffered: a send hands the outcome to a caller still waiting
	abandoned := make(chan struct{})
	started := l.background.Go(func() {
		detached := context.WithoutCancel(ctx)
		err := m.TryLockContext(detached)
		select {
		case result <- err:
		case <-abandoned:
			if err == nil {
				undo, cancel := context.WithTimeout(detached, opTimeout(ttl))
				_, _ = m.UnlockContext(undo)
				cancel()
			}
		}
	})
	if !started {
		return lockkit.ErrClosed
	}
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		close(abandoned)
		return ctx.Err()
	}
}

// mutex builds a fresh redsync.Mutex per operation: a Mutex keeps its
// expiry and validity in unguarded fields, so the watchdog and a caller's
// Extend must not share one.
func (l *Locker) mutex(key string, ttl time.Duration, value string) *redsync.Mutex {
	// No WithFailFast: it answers once a majority has, while the other
	// masters' SETs are still in flight, and a failed attempt's clean-up
	// can then reach a master before its SET does and leave our value
	// there for a TTL. Waiting for every master costs opTimeout at most.
	opts := []redsync.Option{
		redsync.WithExpiry(ttl),
		redsync.WithDriftFactor(driftFactor),
		redsync.WithTries(1),
		redsync.WithTimeoutFactor(float64(opTimeout(ttl)) / float64(ttl)),
	}
	if value != "" {
		opts = append(opts, redsync.WithValue(value))
	}
	return l.rs.NewMutex(key, opts...)
}

// driftFactor is redsync's default: the share of a TTL by which the
// masters' clocks may run ahead of ours.
const driftFactor = 0.01

// drift is the clock-drift allowance redsync charges a TTL, on a grant's
// validity and on an extension's alike.
func drift(ttl time.Duration) time.Duration {
	return time.Duration(int64(float64(ttl) * driftFactor))
}

// opTimeout bounds one operation on the masters: Redlock's "small compared
// to the TTL" (redsync's 5%), but never under 50 ms, which a loaded machine
// needs and the validity computation already charges to the lease.
func opTimeout(ttl time.Duration) time.Duration {
	return max(ttl/20, 50*time.Millisecond)
}

// ownerErr maps a failed owner-checked operation: ErrNotHeld when a
// majority answered that the key is not ours (expired or another value) or
// every master answered; ErrUnavailable when the silent masters could still
// hold our grant, so nobody can tell.
func (l *Locker) ownerErr(ok bool, err error) error {
	if ok {
		return nil
	}
	down, notOurs := tally(err)
	if down > 0 && notOurs < l.quorum {
		return fmt.Errorf("%w: %w", lockkit.ErrUnavailable, err)
	}
	return lockkit.ErrNotHeld
}

// tally counts, in redsync's joined errors, the masters that did not answer
// and those that answered the key is not ours.
func tally(err error) (down, notOurs int) {
	var walk func(error)
	walk = func(err error) {
		if joined, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range joined.Unwrap() {
				walk(e)
			}
			return
		}
		switch e := err.(type) {
		case *redsync.RedisError:
			down++
		case *redsync.ErrNodeTaken:
			notOurs++
		case *redsync.ErrTaken:
			notOurs += len(e.Nodes)
		default:
			if errors.Is(err, redsync.ErrLockAlreadyExpired) {
				notOurs++
			}
		}
	}
	if err != nil {
		walk(err)
	}
	return down, notOurs
}

// Close stops every lease's watchdog; waiters get ErrClosed. It returns
// once every attempt in flight has finished, also those whose callers left,
// each bounded by two operation timeouts. Leases still held expire by their TTL; the
// clients stay open.
func (l *Locker) Close() error {
	l.background.Stop()
	l.background.Wait()
	return nil
}
