// Package redislock is the lockkit backend on Redis: SET NX PX and a fencing
// token in one Lua script, owner-checked release and extend, and waiters
// that wake on a release message instead of polling (docs/backends-redis.md).
//
// It works on a single node, behind Sentinel and on a Cluster (through
// go-redis UniversalClient): all keys of one lock share the hash tag {key}.
//
// Tokens: the larger of the key's stored counter + 1 and the server's clock
// in microseconds (fence.lua). A failover to a replica that missed the last
// grants, a restart without persistence or an evicted counter so still
// yields a token above every earlier one, unless the granting server's
// clock reads earlier than the one that issued the last token did. A
// failover can still leave two live grants; the fenced stores refuse the
// older one's writes.
//
// Storage: each key ever locked keeps its fence counter, "{key}:fence", after
// release. That is one small string per key, about 60-90 bytes of Redis
// memory with its overhead; a service that locks millions of distinct,
// short-lived keys (Redisson issue 6510) should lock a bounded set of keys
// (e.g. per account, not per request). With tokens floored at the clock, a
// counter may also be expired once no grant of its key is live: a new one
// starts above it anyway.
package redislock

import (
	"cmp"
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
	"github.com/lockbench/shop/internal/lockkit/backend"
)

var (
	//go:embed fence.lua
	fenceLua string
	//go:embed wanted.lua
	wantedLua string
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
	//go:embed handover.lua
	handOverLua string
	//go:embed unfenced_acquire.lua
	unfencedAcquireLua string

	// Scripts run with EVALSHA and fall back to EVAL once after a NOSCRIPT
	// (a restarted or failed-over server has an empty script cache).
	acquireScript     = redis.NewScript(fenceLua + wantedLua + acquireLua)
	fairAcquireScript = redis.NewScript(fenceLua + wantedLua + fairAcquireLua)
	unfencedScript    = redis.NewScript(wantedLua + unfencedAcquireLua)
	releaseScript     = redis.NewScript(releaseLua)
	handOverScript    = redis.NewScript(fenceLua + handOverLua)
	extendScript      = redis.NewScript(extendLua)
	abandonScript     = redis.NewScript(abandonLua)
)

// DefaultWaiterTimeout is how long a fair-queue waiter that stopped calling
// in (it crashed) keeps its place before the next waiter may pass it.
const DefaultWaiterTimeout = 3 * time.Second

// yieldWake is how late a release that freed a marked key for the waiters
// elsewhere wakes the head here, should the release message not reach
// it: long after a waiter elsewhere has heard the message and asked.
const yieldWake = 20 * time.Millisecond

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
	id            string        // random, names this Locker in owner values
	seq           atomic.Uint64 // numbers its acquisitions

	// closing is cancelled by Close: it ends every wait and every call
	// in flight. Close then waits for inflight (the Acquires running and
	// the clean-ups they left behind), so that nothing of the Locker
	// touches the client after Close returns.
	closing  context.Context
	shutdown context.CancelFunc
	enterMu  sync.RWMutex // orders inflight.Add before Close's Wait
	inflight sync.WaitGroup
}

// ErrDeadlinesIgnored is returned by New for a go-redis client created
// without ContextTimeoutEnabled (go-redis's default). Such a client ignores
// the context's deadline on a connection that stopped answering, so an
// Acquire against an unreachable Redis would take the client's read
// timeouts and retries (seconds), whatever its wait timeout says.
var ErrDeadlinesIgnored = errors.New("redislock: the go-redis client ignores context deadlines: create it with ContextTimeoutEnabled: true")

// New returns a Locker on client. Close it to stop its background work; the
// client stays open (it belongs to the caller). It refuses a client that
// would ignore deadlines (ErrDeadlinesIgnored).
func New(client redis.UniversalClient, opts ...Option) (*Locker, error) {
	if ignoresDeadlines(client) {
		return nil, ErrDeadlinesIgnored
	}
	id := make([]byte, 12)
	_, _ = rand.Read(id)
	l := &Locker{client: client, waiterTimeout: DefaultWaiterTimeout, id: hex.EncodeToString(id) + ":"}
	for _, opt := range opts {
		opt(l)
	}
	l.closing, l.shutdown = context.WithCancel(context.Background())
	l.room = newWaitRoom(client, l.free)
	return l, nil
}

// ignoresDeadlines reads the flag on go-redis's own clients; a client of
// another type is trusted to keep its context's deadline.
func ignoresDeadlines(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return !c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return !c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return !c.Options().ContextTimeoutEnabled
	}
	return false
}

// enter registers a call that Close must wait for; false once closed.
func (l *Locker) enter() bool {
	l.enterMu.RLock()
	defer l.enterMu.RUnlock()
	if l.closing.Err() != nil {
		return false
	}
	l.inflight.Add(1)
	return true
}

// Capabilities of the Redis backend.
func (l *Locker) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{Fencing: true, WaitNoPoll: true, Fair: true, LostSignal: true,
		Expires: true, OwnerCheck: true, CrossProcess: true}
}

// keyset names a lock's keys, all in one hash slot: the lock itself and
// the names derived from it, built only when needed (an uncontended cycle
// needs two of them). wanted is set by waiters and asks the release for a
// message on channel (wanted.lua).
type keyset string

func (l *Locker) keys(key string) keyset { return keyset("{" + l.prefix + key + "}") }

func (k keyset) lock() string      { return string(k) }
func (k keyset) fence() string     { return string(k) + ":fence" }
func (k keyset) wanted() string    { return string(k) + ":wanted" }
func (k keyset) queue() string     { return string(k) + ":queue" }
func (k keyset) deadlines() string { return string(k) + ":waiters" }
func (k keyset) channel() string   { return string(k) + ":released" }

// TryAcquire makes one attempt. With WithFair it is refused while others
// queue, even if the key is free: their turn comes first.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	if !l.enter() {
		return nil, lockkit.ErrClosed
	}
	defer l.inflight.Done()
	o, watchdog := backend.Resolve(opts)
	lease, _, err := l.attempt(ctx, key, l.keys(key), l.newOwner(), o, watchdog, trying)
	if err == nil && lease == nil {
		err = lockkit.ErrNotAcquired
	}
	return lease, err
}

// Acquire waits for key. Plain waiters of one process queue here in arrival
// order and only the first of them asks Redis; fair waiters take their
// place in the key's Redis queue on arrival, so that arrival order holds
// across processes. A waiter wakes on the release message, on a release by
// this process, on a (re)subscription that may have missed a release, or
// when the holder's TTL runs out (a crashed holder sends no message).
func (l *Locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	if !l.enter() {
		return nil, lockkit.ErrClosed
	}
	defer l.inflight.Done()
	o, watchdog := backend.Resolve(opts)
	owner := l.newOwner()
	ks := l.keys(key)

	// The wait timeout bounds the first call too: a server that stopped
	// answering must not hold it for the client's read timeout.
	bounded := ctx
	if o.WaitTimeout > 0 {
		var cancel context.CancelFunc
		bounded, cancel = backend.WaitContext(ctx, o)
		defer cancel()
	}
	wait := time.Duration(0)
	// A plain arrival tries at once unless others here wait already (no
	// barging past them); a fair one always calls, to take its place.
	if o.Fair || !l.room.busy(ks) {
		lease, pttl, err := l.arrive(ctx, bounded, key, ks, owner, o, watchdog)
		if lease != nil || err != nil {
			return lease, err
		}
		wait = pttl
	}

	waitCtx, cancel := context.WithCancel(bounded)
	defer cancel()
	defer context.AfterFunc(l.closing, cancel)()
	fail := func(err error) (lockkit.Lease, error) {
		if !ended(waitCtx) {
			return nil, err
		}
		switch {
		case ended(ctx):
			return nil, cmp.Or(ctx.Err(), context.DeadlineExceeded)
		case l.closing.Err() != nil:
			return nil, lockkit.ErrClosed
		}
		return nil, backend.WaitErr(ctx, waitCtx)
	}
	w, subscribed, err := l.room.join(waitCtx, ks.channel(), owner, o.Fair, o.TTL)
	if err != nil {
		if o.Fair {
			l.abandonLater(ks, owner) // leave the queue
		}
		return fail(err)
	}
	granted := time.Duration(0) // the TTL of our grant, if we got one
	defer func() { l.room.leave(w, granted) }()

	// Reset before every wait; since Go 1.23 neither Reset nor Stop can
	// leave a stale tick behind, so no draining is needed.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	look := !subscribed // the confirmation of our SUBSCRIBE wakes us
	if w.heldHere > 0 {
		// Our turn came because the waiter ahead was granted the key:
		// asking now would be refused. Its release by this process wakes
		// us, and a lease that ends otherwise has run out by then.
		look, wait = false, w.heldHere
	}
	for {
		// Once closing, a grant handed here is not taken: leave frees it,
		// and the caller gets ErrClosed, as Close promises.
		if l.closing.Err() == nil {
			if h := l.room.take(w); h != nil {
				granted = o.TTL
				return l.newLease(key, ks, h.owner, o, watchdog, h.fence, h.sent), nil
			}
		}
		if look {
			lease, pttl, err := l.attempt(waitCtx, key, ks, owner, o, watchdog, waiting)
			if lease != nil {
				granted = o.TTL
				return lease, nil
			}
			if err != nil {
				return fail(err)
			}
			wait = pttl
		}
		look = true
		if o.Fair {
			wait = min(wait, l.waiterTimeout/3) // keep our place in the queue
		}
		timer.Reset(max(wait, time.Millisecond))
		select {
		case <-w.wake:
		case <-timer.C:
		case <-waitCtx.Done():
			if o.Fair {
				l.abandonLater(ks, owner)
			}
			return fail(waitCtx.Err())
		}
	}
}

// ended reports whether ctx is done or past its deadline: a dial or read
// that timed out on ctx's deadline can return before ctx itself is marked
// done, and its error must still read as the wait's end, not an outage.
func ended(ctx context.Context) bool {
	deadline, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(deadline)
}

// arrive is Acquire's first attempt, under bounded: ctx and the wait
// timeout. It does without the Locker's closing signal: registering with
// it costs the uncontended path.
func (l *Locker) arrive(ctx, bounded context.Context, key string, ks keyset, owner string, o lockkit.Options, watchdog bool) (lockkit.Lease, time.Duration, error) {
	lease, pttl, err := l.attempt(bounded, key, ks, owner, o, watchdog, arriving)
	switch {
	case err == nil:
		return lease, pttl, nil
	case ended(ctx):
		return nil, 0, cmp.Or(ctx.Err(), context.DeadlineExceeded)
	case ended(bounded):
		return nil, 0, lockkit.ErrNotAcquired
	}
	return nil, 0, err
}

// stage is where an attempt stands in its acquisition.
type stage int

const (
	trying   stage = iota // TryAcquire: one attempt, no wait
	arriving              // Acquire's first attempt
	waiting               // Acquire's attempts once it waits
)

// attempt runs the acquire script once. It returns a lease, or how long to
// wait before the next attempt at the latest, or an error. A fair Acquire
// takes or keeps its place in the queue. A waiting plain one marks the key
// as wanted, so that the release sends a message; an arriving one need
// not, since a refused arrival always calls again before it sleeps (at
// once, or when its subscription is confirmed), and so the uncontended
// call carries no more keys than it must: each costs the server time.
func (l *Locker) attempt(ctx context.Context, key string, ks keyset, owner string, o lockkit.Options, watchdog bool, st stage) (lockkit.Lease, time.Duration, error) {
	if o.Unfenced && !o.Fair {
		return l.attemptUnfenced(ctx, key, ks, owner, o, watchdog, st)
	}
	sent := time.Now()
	var res int64
	var err error
	switch {
	case o.Fair:
		timeout := time.Duration(0)
		if st != trying {
			timeout = l.waiterTimeout
		}
		res, err = fairAcquireScript.Run(ctx, l.client, []string{ks.lock(), ks.fence(), ks.queue(), ks.deadlines(), ks.wanted()},
			owner, o.TTL.Milliseconds(), timeout.Milliseconds()).Int64()
	case st == waiting:
		res, err = acquireScript.Run(ctx, l.client, []string{ks.lock(), ks.fence(), ks.wanted()}, owner, o.TTL.Milliseconds()).Int64()
	default:
		res, err = acquireScript.Run(ctx, l.client, []string{ks.lock(), ks.fence()}, owner, o.TTL.Milliseconds()).Int64()
	}
	if err != nil {
		// The script may have run although its reply was lost.
		l.abandonLater(ks, owner)
		return nil, 0, unavailable(ctx, err)
	}
	if res <= 0 { // refused: -1 - how long to wait (fence.lua)
		return nil, time.Duration(-1-res) * time.Millisecond, nil
	}
	return l.newLease(key, ks, owner, o, watchdog, uint64(res), sent), 0, nil
}

// attemptUnfenced is attempt for a plain lease asked WithoutFence: a plain
// SET NX PX on arrival, whose refusal makes the caller call again (as a
// fenced arrival's does, see attempt); a waiter's call also reads the
// holder's pttl and marks the key as wanted. A fair lease ignores
// WithoutFence: its queue lives in the same script as its token.
func (l *Locker) attemptUnfenced(ctx context.Context, key string, ks keyset, owner string, o lockkit.Options, watchdog bool, st stage) (lockkit.Lease, time.Duration, error) {
	sent := time.Now()
	var granted bool
	var err error
	if st == waiting {
		var res int64
		res, err = unfencedScript.Run(ctx, l.client, []string{ks.lock(), ks.wanted()}, owner, o.TTL.Milliseconds()).Int64()
		if err == nil && res < 0 {
			return nil, time.Duration(-1-res) * time.Millisecond, nil
		}
		granted = err == nil
	} else {
		granted, err = l.client.SetNX(ctx, ks.lock(), owner, o.TTL).Result()
	}
	if err != nil {
		l.abandonLater(ks, owner) // the SET may have landed although its reply was lost
		return nil, 0, unavailable(ctx, err)
	}
	if !granted {
		return nil, 0, nil
	}
	return l.newLease(key, ks, owner, o, watchdog, 0, sent), 0, nil
}

// newLease is the lease of a grant to owner, made by a call sent at sent:
// the lease's TTL counts from then, before the server granted it.
func (l *Locker) newLease(key string, ks keyset, owner string, o lockkit.Options, watchdog bool, fence uint64, sent time.Time) lockkit.Lease {
	return backend.NewLease(backend.Grant{
		Key: key, Fence: fence, TTL: o.TTL, Watchdog: watchdog, Sent: sent,
		Extend: func(ctx context.Context, ttl time.Duration) error {
			// The watchdog's renewals run on their own goroutine: Close
			// ends one in flight and waits for it, so that the caller may
			// close the client once Close returns.
			if !l.enter() {
				return lockkit.ErrClosed
			}
			defer l.inflight.Done()
			ctx, cancel := context.WithCancel(ctx)
			defer cancel()
			defer context.AfterFunc(l.closing, cancel)()
			ok, err := extendScript.Run(ctx, l.client, []string{ks.lock()}, owner, ttl.Milliseconds()).Int()
			if err != nil {
				return unavailable(ctx, err)
			}
			if ok == 0 {
				return lockkit.ErrNotHeld
			}
			return nil
		},
		Release: func(ctx context.Context) error {
			if !o.Fair {
				if handled, err := l.handOver(ctx, ks, owner); handled {
					return err
				}
			}
			releaseKeys := []string{ks.lock(), ks.wanted()}
			if o.Fair {
				releaseKeys = append(releaseKeys, ks.queue(), ks.deadlines())
			}
			res, err := releaseScript.Run(ctx, l.client, releaseKeys, owner).Result()
			next, freed := res.(string) // 0 (an integer): not ours
			if freed {
				l.room.freed(ks)
			}
			// Our own waiters need not wait for the message's round trip.
			// Wake them whatever the outcome: the next one here may not
			// have marked the key (it knew the key was held here), and a
			// release that failed or found the lease gone sends nothing.
			l.room.wake(ks, next)
			if err != nil {
				return unavailable(ctx, err)
			}
			if !freed {
				return lockkit.ErrNotHeld
			}
			return nil
		},
		Closed: l.closing.Done(),
	})
}

// handOver releases a plain lease of owner by granting the key to the
// plain waiter at the head here, in the same script, unless a waiter
// marked the key and the run of hand-overs here has reached
// backend.HandOffRun (handover.lua); handled is false if there is no such
// waiter, or Redis refused the script, and the caller releases as usual.
//
// The run is what a process with waiters of its own gains from a hand-over
// in one call while others wait too. Without it every release with a
// waiter elsewhere freed the key, and its waiters in every process raced
// for it, a release, a message and an acquire later.
// Like a plain release it runs on the caller's context alone and does not
// hold Close up; a grant whose waiter left, or whose outcome is unknown,
// is freed (free).
func (l *Locker) handOver(ctx context.Context, ks keyset, owner string) (handled bool, err error) {
	w, keep := l.room.offer(ks)
	if w == nil {
		return false, nil
	}
	to := l.newOwner()
	sent := time.Now()
	keepMarked := "0"
	if keep {
		keepMarked = "1"
	}
	res, err := handOverScript.Run(ctx, l.client, []string{ks.lock(), ks.wanted(), ks.fence()}, owner, to, w.ttl.Milliseconds(), keepMarked).Int64()
	if err == nil && res > 0 {
		l.room.handedOver(ks)
		if !l.room.settle(w, &handover{ks: ks, owner: to, fence: uint64(res), sent: sent}) {
			l.free(ks, to) // the waiter has left
		}
		return true, nil
	}
	l.room.settle(w, nil)
	if err == nil && res < 0 {
		// Freed for the waiters elsewhere, and all were told, the head
		// here too: it races them on the same message, not ahead of it,
		// or it would win nearly every time and start the next run. It
		// is woken here as well, late, in case the message does not come
		// (a stalled subscription): it may not have marked the key,
		// knowing it held here.
		l.room.freed(ks)
		time.AfterFunc(yieldWake, func() { l.room.wakeIfHead(w) })
		return true, nil
	}
	// Wake the head here whatever the outcome, as a plain release does: it
	// may not have marked the key, knowing it held here, and a release
	// that failed sends no message.
	l.room.wake(ks, "")
	var replyErr redis.Error
	switch {
	case errors.As(err, &replyErr) && !isLoading(replyErr):
		// Redis refused the script (a write refused under maxmemory, say):
		// free the key as a plain release does, and the grant, should the
		// script have got that far.
		l.free(ks, to)
		return false, nil
	case err != nil:
		l.free(ks, to) // the key may have been handed over all the same
		return true, unavailable(ctx, err)
	case res == 0:
		return true, lockkit.ErrNotHeld
	}
	return true, nil
}

// free gives up a grant to owner nobody will take: in the background, which
// Close waits for, or, once closed, here and now (500 ms at most), as the
// release that made it runs after Close too.
func (l *Locker) free(ks keyset, owner string) {
	if l.enter() {
		l.abandonLater(ks, owner)
		l.inflight.Done()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_ = abandonScript.Run(ctx, l.client, []string{ks.lock(), ks.queue(), ks.deadlines()}, owner, ks.channel()).Err()
}

// abandonLater leaves the fair queue and frees a grant whose reply was
// lost, in the background: the caller returns at once, whether or not
// Redis answers, and Close waits for it. Its context is its own (the
// caller's may be the one that just ended) and short.
func (l *Locker) abandonLater(ks keyset, owner string) {
	l.inflight.Add(1) // the caller's own registration is still held
	go func() {
		defer l.inflight.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_ = abandonScript.Run(ctx, l.client, []string{ks.lock(), ks.queue(), ks.deadlines()}, owner, ks.channel()).Err()
	}()
}

// Close ends every wait (waiters get ErrClosed and leave the fair queues),
// stops the watchdogs and the subscription, and returns once nothing of the
// Locker uses the client any more: a first attempt already sent is not
// interrupted (its caller's context bounds it) and clean-ups get 500 ms.
// A release, handing the key to a waiter here or not, runs on its caller's
// context alone.
// Leases still held expire by their TTL.
func (l *Locker) Close() error {
	l.enterMu.Lock()
	l.shutdown()
	l.enterMu.Unlock()
	l.room.close()
	l.inflight.Wait()
	return nil
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
