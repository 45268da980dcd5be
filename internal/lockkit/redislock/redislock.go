// Package redislock is the lockkit backend on Redis: SET NX PX and an INCR
// fencing counter in one Lua script, owner-checked release and extend, and
// waiters that wake on a release message instead of polling.
//
// It works on a single node, behind Sentinel and on a Cluster (through
// go-redis UniversalClient): all keys of one lock share the hash tag {key}.
//
// Storage: each key ever locked keeps its fence counter, "{key}:fence", after
// release, because a token that restarted from 1 would let a stale holder
// through a fenced store. That is one small string per key, about 60-90 bytes
// of Redis memory with its overhead; a service that locks millions of
// distinct, short-lived keys (Redisson issue 6510) should lock a bounded set
// of keys (e.g. per account, not per request) or expire counters it can prove
// no store still compares against.
//
// Safety note: a Redis failover can lose a grant and its fence increment
// that were not yet replicated, so a second holder may get a token that is
// not higher than the first's. Fenced stores then refuse the older-looking
// holder's writes or, if the counter went backwards, the new holder's: safety
// is kept at the cost of liveness until the counter passes the old value.
package redislock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
)

var (
	//go:embed acquire.lua
	acquireLua string
	//go:embed fair_acquire.lua
	fairAcquireLua string
	//go:embed release.lua
	releaseLua string
	//go:embed extend.lua
	extendLua string
	//go:embed abandon.lua
	abandonLua string

	// Scripts run with EVALSHA and fall back to EVAL once after a NOSCRIPT
	// (a restarted or failed-over server has an empty script cache).
	acquireScript     = redis.NewScript(acquireLua)
	fairAcquireScript = redis.NewScript(fairAcquireLua)
	releaseScript     = redis.NewScript(releaseLua)
	extendScript      = redis.NewScript(extendLua)
	abandonScript     = redis.NewScript(abandonLua)
)

// DefaultWaiterTimeout is how long a fair-queue waiter that stopped calling
// in (it crashed) keeps its place before the next waiter may pass it.
const DefaultWaiterTimeout = 3 * time.Second

// Option configures a Locker.
type Option func(*Locker)

// WithPrefix namespaces every key, e.g. per service or per test.
func WithPrefix(prefix string) Option { return func(l *Locker) { l.prefix = prefix } }

// WithWaiterTimeout sets how long a silent fair-queue waiter keeps its place.
func WithWaiterTimeout(d time.Duration) Option { return func(l *Locker) { l.waiterTimeout = d } }

// Locker is the Redis backend. It is safe for concurrent use; share one per
// process so that its waiters share one subscription connection.
type Locker struct {
	client        redis.UniversalClient
	prefix        string
	waiterTimeout time.Duration
	room          *waitRoom
	closed        chan struct{}
	closeOnce     sync.Once
	id            string        // random, names this Locker in owner values
	seq           atomic.Uint64 // numbers its acquisitions
}

// New returns a Locker on client. Close it to stop its background work; the
// client stays open (it belongs to the caller).
func New(client redis.UniversalClient, opts ...Option) *Locker {
	id := make([]byte, 12)
	_, _ = rand.Read(id)
	l := &Locker{client: client, waiterTimeout: DefaultWaiterTimeout, closed: make(chan struct{}),
		id: hex.EncodeToString(id) + ":"}
	for _, opt := range opts {
		opt(l)
	}
	l.room = newWaitRoom(client, l.closed)
	return l
}

// Capabilities of the Redis backend.
func (l *Locker) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{Fencing: true, WaitNoPoll: true, Fair: true, LostSignal: true,
		Expires: true, OwnerCheck: true, CrossProcess: true}
}

type keyset struct{ lock, fence, queue, deadlines, channel string }

func (l *Locker) keys(key string) keyset {
	base := "{" + l.prefix + key + "}"
	return keyset{lock: base, fence: base + ":fence", queue: base + ":queue",
		deadlines: base + ":waiters", channel: base + ":released"}
}

// TryAcquire makes one attempt. With WithFair it is refused while others
// queue, even if the key is free: their turn comes first.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	if l.isClosed() {
		return nil, lockkit.ErrClosed
	}
	o, watchdog := lockkit.Resolve(opts)
	lease, _, err := l.attempt(ctx, key, l.keys(key), l.newOwner(), o, watchdog, false)
	if err == nil && lease == nil {
		err = lockkit.ErrNotAcquired
	}
	return lease, err
}

// Acquire waits for key. Waiters of one process queue in arrival order and
// only the first of them asks Redis; it wakes on the release message, on a
// release by this process, or when the holder's TTL runs out (a crashed
// holder never sends a message).
func (l *Locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	if l.isClosed() {
		return nil, lockkit.ErrClosed
	}
	o, watchdog := lockkit.Resolve(opts)
	owner := l.newOwner()
	ks := l.keys(key)
	if !l.room.busy(ks.channel) { // nobody here waits: no barging past them
		// Not queued in Redis yet: a place there belongs to the head of
		// the local queue, which this caller may not become.
		lease, _, err := l.attempt(ctx, key, ks, owner, o, watchdog, false)
		if lease != nil || err != nil {
			return lease, err
		}
	}

	waitCtx, cancel := o.WaitContext(ctx)
	defer cancel()
	w, err := l.room.join(waitCtx, ks.channel, owner)
	if err != nil {
		if o.Fair {
			l.abandon(ks, owner)
		}
		return nil, l.waitErr(ctx, waitCtx, err)
	}
	defer l.room.leave(w)

	// Reset before every wait; since Go 1.23 neither Reset nor Stop can
	// leave a stale tick behind, so no draining is needed.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		lease, pttl, err := l.attempt(waitCtx, key, ks, owner, o, watchdog, o.Fair)
		if lease != nil {
			return lease, nil
		}
		if err != nil {
			return nil, l.waitErr(ctx, waitCtx, err)
		}
		if o.Fair {
			pttl = min(pttl, l.waiterTimeout/3) // keep our place in the queue
		}
		timer.Reset(max(pttl, time.Millisecond))
		select {
		case <-w.wake:
			timer.Stop()
		case <-timer.C:
		case <-waitCtx.Done():
			l.abandon(ks, owner)
			return nil, lockkit.WaitErr(ctx, waitCtx)
		case <-l.closed:
			return nil, lockkit.ErrClosed
		}
	}
}

func (l *Locker) waitErr(ctx, waitCtx context.Context, err error) error {
	if waitCtx.Err() != nil {
		return lockkit.WaitErr(ctx, waitCtx)
	}
	return err
}

// attempt runs the acquire script once. It returns a lease, or the time the
// holder's grant has left, or an error.
func (l *Locker) attempt(ctx context.Context, key string, ks keyset, owner string, o lockkit.Options, watchdog, queue bool) (lockkit.Lease, time.Duration, error) {
	sent := time.Now()
	fairFlag := "0"
	if o.Fair {
		fairFlag = "1"
	}
	var res []int64
	var err error
	if o.Fair {
		timeout := time.Duration(0)
		if queue {
			timeout = l.waiterTimeout
		}
		res, err = fairAcquireScript.Run(ctx, l.client, []string{ks.lock, ks.fence, ks.queue, ks.deadlines},
			owner, o.TTL.Milliseconds(), timeout.Milliseconds()).Int64Slice()
	} else {
		res, err = acquireScript.Run(ctx, l.client, []string{ks.lock, ks.fence}, owner, o.TTL.Milliseconds()).Int64Slice()
	}
	if err != nil {
		// The script may have run although its reply was lost.
		l.abandon(ks, owner)
		return nil, 0, unavailable(ctx, err)
	}
	if len(res) != 2 {
		return nil, 0, fmt.Errorf("redislock: acquire script returned %v", res)
	}
	if res[0] == 0 {
		return nil, time.Duration(res[1]) * time.Millisecond, nil
	}
	return lockkit.NewLease(lockkit.Grant{
		Key: key, Fence: uint64(res[0]), TTL: o.TTL, Watchdog: watchdog, Sent: sent,
		Extend: func(ctx context.Context, ttl time.Duration) error {
			ok, err := extendScript.Run(ctx, l.client, []string{ks.lock}, owner, ttl.Milliseconds()).Int()
			if err != nil {
				return unavailable(ctx, err)
			}
			if ok == 0 {
				return lockkit.ErrNotHeld
			}
			return nil
		},
		Release: func(ctx context.Context) error {
			ok, err := releaseScript.Run(ctx, l.client, []string{ks.lock, ks.queue, ks.deadlines}, owner, ks.channel, fairFlag).Int()
			if err != nil {
				return unavailable(ctx, err)
			}
			if ok == 0 {
				return lockkit.ErrNotHeld
			}
			// Our own waiters need not wait for the message's round trip.
			l.room.wake(ks.channel, "")
			return nil
		},
		Closed: l.closed,
	}), 0, nil
}

// abandon leaves the fair queue and frees a grant whose reply was lost.
// Best effort, on a context of its own: the caller's may be the one that
// just ended.
func (l *Locker) abandon(ks keyset, owner string) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_ = abandonScript.Run(ctx, l.client, []string{ks.lock, ks.queue, ks.deadlines}, owner, ks.channel).Err()
}

// Close stops the watchdogs and the subscription; waiters get ErrClosed.
// Leases still held expire by their TTL.
func (l *Locker) Close() error {
	l.closeOnce.Do(func() {
		close(l.closed)
		l.room.close()
	})
	return nil
}

func (l *Locker) isClosed() bool {
	select {
	case <-l.closed:
		return true
	default:
		return false
	}
}

// unavailable marks errors of reaching Redis, as opposed to errors Redis
// answered (a script error is a bug, not an outage).
func unavailable(ctx context.Context, err error) error {
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	var replyErr redis.Error
	if errors.As(err, &replyErr) && !isLoading(replyErr) {
		return err
	}
	return fmt.Errorf("%w: %w", lockkit.ErrUnavailable, err)
}

// isLoading reports server states that pass: a restarting or failing-over
// node answers LOADING, MASTERDOWN or READONLY for a while.
func isLoading(err redis.Error) bool {
	msg := err.Error()
	for _, p := range []string{"LOADING", "MASTERDOWN", "READONLY", "CLUSTERDOWN", "TRYAGAIN"} {
		if len(msg) >= len(p) && msg[:len(p)] == p {
			return true
		}
	}
	return false
}

// newOwner names one acquisition: this Locker's random id and a sequence
// number. Owners need to be unique, not secret (a client that can reach
// the lock server can delete any key anyway), so one random draw per
// Locker is enough and keeps a syscall off every acquire.
func (l *Locker) newOwner() string {
	return l.id + strconv.FormatUint(l.seq.Add(1), 36)
}
