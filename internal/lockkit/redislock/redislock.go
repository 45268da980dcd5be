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
	//go:embed acquire.lua
	acquireLua string
	//go:embed fair_acquire.lua
	fairAcquireLua string
	//go:embed handover.lua
	handOverLua string
	//go:embed fence.lua
	fenceLua string
	//go:embed release.lua
	releaseLua string
	//go:embed fair_release.lua
	fairReleaseLua string
	//go:embed extend.lua
	extendLua string
	//go:embed abandon.lua
	abandonLua string

	// Scripts run with EVALSHA and fall back to EVAL once after a NOSCRIPT
	// (a restarted or failed-over server has an empty script cache). Every
	// script that grants ends with fence.lua.
	acquireScript     = redis.NewScript(acquireLua + fenceLua)
	fairAcquireScript = redis.NewScript(fairAcquireLua + fenceLua)
	handOverScript    = redis.NewScript(handOverLua + fenceLua)
	releaseScript     = redis.NewScript(releaseLua)
	fairReleaseScript = redis.NewScript(fairReleaseLua)
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
// needs two of them).
type keyset string

func (l *Locker) keys(key string) keyset { return keyset("{" + l.prefix + key + "}") }

func (k keyset) lock() string      { return string(k) }
func (k keyset) fence() string     { return string(k) + ":fence" }
func (k keyset) queue() string     { return string(k) + ":queue" }
func (k keyset) deadlines() string { return string(k) + ":waiters" }
func (k keyset) wanted() string    { return string(k) + ":wanted" } // see fair_release.lua
func (k keyset) channel() string   { return string(k) + ":released" }

// acquisition is one call of Acquire or TryAcquire: what it asks for, and
// the owner value its grant is made to.
type acquisition struct {
	key      string
	ks       keyset
	owner    string
	o        lockkit.Options
	watchdog bool
}

func (l *Locker) newAcquisition(key string, opts []lockkit.Option) acquisition {
	o, watchdog := backend.Resolve(opts)
	return acquisition{key: key, ks: l.keys(key), owner: l.newOwner(), o: o, watchdog: watchdog}
}

// TryAcquire makes one attempt. With WithFair it is refused while others
// queue, even if the key is free: their turn comes first.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	if !l.enter() {
		return nil, lockkit.ErrClosed
	}
	defer l.inflight.Done()
	lease, _, err := l.attempt(ctx, l.newAcquisition(key, opts), trying)
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
	a := l.newAcquisition(key, opts)
	// The wait timeout bounds the first call too: a server that stopped
	// answering must not hold it for the client's read timeout.
	bounded := ctx
	if a.o.WaitTimeout > 0 {
		var cancel context.CancelFunc
		bounded, cancel = backend.WaitContext(ctx, a.o)
		defer cancel()
	}
	// A plain arrival tries at once unless others here wait already (no
	// barging past them); a fair one always calls, to take its place. It
	// does without the Locker's closing signal: registering with it costs
	// the uncontended path.
	wait := time.Duration(0)
	if a.o.Fair || !l.room.busy(a.ks) {
		lease, pttl, err := l.attempt(bounded, a, arriving)
		if lease != nil || err != nil {
			return lease, l.waitErr(ctx, bounded, err)
		}
		wait = pttl
	}
	return l.wait(ctx, bounded, a, wait)
}

// wait queues a refused Acquire in the wait room until it is granted, or
// its wait or the Locker ends. It looks at the key at most wait from now.
func (l *Locker) wait(ctx, bounded context.Context, a acquisition, wait time.Duration) (lockkit.Lease, error) {
	waitCtx, cancel := context.WithCancel(bounded)
	defer cancel()
	defer context.AfterFunc(l.closing, cancel)()
	w, subscribed, err := l.room.join(waitCtx, a.ks.channel(), a.owner, a.o.Fair, a.o.TTL)
	if err != nil {
		if a.o.Fair {
			l.abandonLater(a.ks, a.owner) // leave the queue
		}
		return nil, l.waitErr(ctx, waitCtx, err)
	}
	// The confirmation of our SUBSCRIBE wakes us; otherwise a release may
	// have come before we joined.
	look := !subscribed
	if w.heldHere > 0 {
		// Our turn came because the waiter ahead was granted the key:
		// asking now would be refused. Its release by this process wakes
		// us, and a lease that ends otherwise has run out by then.
		look, wait = false, w.heldHere
	}
	lease, err := l.waitTurn(waitCtx, a, w, look, wait)
	granted := time.Duration(0) // the TTL of our grant, if we got one
	if lease != nil {
		granted = a.o.TTL
	}
	l.room.leave(w, granted)
	if err != nil {
		return nil, l.waitErr(ctx, waitCtx, err)
	}
	return lease, nil
}

// waitTurn asks Redis for the key whenever w is woken, or wait has passed
// since it last heard, until it is granted (by Redis or by a release here)
// or waitCtx ends. A fair waiter calls in at least every third of the
// waiter timeout to keep its place.
func (l *Locker) waitTurn(waitCtx context.Context, a acquisition, w *waiter, look bool, wait time.Duration) (lockkit.Lease, error) {
	// Reset before every wait; since Go 1.23 neither Reset nor Stop can
	// leave a stale tick behind, so no draining is needed.
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if lease := l.takeHandOver(a, w); lease != nil {
			return lease, nil
		}
		if look {
			lease, pttl, err := l.attempt(waitCtx, a, waiting)
			if lease != nil || err != nil {
				return lease, err
			}
			wait = pttl
		}
		look = true
		if a.o.Fair {
			wait = min(wait, l.waiterTimeout/3)
		}
		timer.Reset(max(wait, time.Millisecond))
		select {
		case <-w.wake:
		case <-timer.C:
		case <-waitCtx.Done():
			if a.o.Fair {
				l.abandonLater(a.ks, a.owner)
			}
			return nil, waitCtx.Err()
		}
	}
}

// takeHandOver returns the lease of a grant a release here handed to w,
// if any. Once closing it is not taken: leave frees it, and the caller
// gets ErrClosed, as Close promises.
func (l *Locker) takeHandOver(a acquisition, w *waiter) lockkit.Lease {
	if l.closing.Err() != nil {
		return nil
	}
	h := l.room.take(w)
	if h == nil {
		return nil
	}
	return l.newLease(a, h.owner, h.fence, h.sent)
}

// waitErr is what Acquire answers when a call under waitCtx, which ctx
// bounds, failed with err: err itself (nil too) if waitCtx had not ended,
// and otherwise why it ended.
func (l *Locker) waitErr(ctx, waitCtx context.Context, err error) error {
	switch {
	case err == nil || !ended(waitCtx):
		return err
	case ended(ctx):
		return cmp.Or(ctx.Err(), context.DeadlineExceeded)
	case l.closing.Err() != nil:
		return lockkit.ErrClosed
	}
	return backend.WaitErr(ctx, waitCtx)
}

// ended reports whether ctx is done or past its deadline: a dial or read
// that timed out on ctx's deadline can return before ctx itself is marked
// done, and its error must still read as the wait's end, not an outage.
func ended(ctx context.Context) bool {
	deadline, ok := ctx.Deadline()
	return ctx.Err() != nil || ok && !time.Now().Before(deadline)
}

// stage is where an attempt stands in its acquisition.
type stage int

const (
	trying   stage = iota // TryAcquire: one attempt, no wait
	arriving              // Acquire's first attempt
	waiting               // Acquire's attempts once it waits
)

// attempt asks Redis for the key once. It returns a lease, or how long to
// wait before the next attempt at the latest, or an error.
func (l *Locker) attempt(ctx context.Context, a acquisition, st stage) (lockkit.Lease, time.Duration, error) {
	sent := time.Now()
	res, err := l.grant(ctx, a, st)
	if err != nil {
		// The grant may have landed although its reply was lost.
		l.abandonLater(a.ks, a.owner)
		return nil, 0, unavailable(ctx, err)
	}
	if res < 0 { // refused: -1 - how long to wait at most (fence.lua)
		return nil, time.Duration(-1-res) * time.Millisecond, nil
	}
	return l.newLease(a, a.owner, uint64(res), sent), 0, nil
}

// grant runs one acquisition call: the token (0 unfenced) on a grant,
// otherwise -1 - the ms to wait at most. A fair one takes or keeps its
// place in the queue (and ignores WithoutFence: its queue lives in the
// same script as its token). A waiting plain one marks the lease, so that
// its release sends a message; an arriving one need not, since a refused
// arrival always calls again before it sleeps (at once, or when its
// subscription is confirmed). So an uncontended grant carries no more than
// it must: a fenced one two keys, an unfenced one is a plain SET NX PX.
func (l *Locker) grant(ctx context.Context, a acquisition, st stage) (int64, error) {
	ttl := a.o.TTL.Milliseconds()
	switch {
	case a.o.Fair:
		timeout := l.waiterTimeout.Milliseconds()
		if st == trying {
			timeout = 0
		}
		keys := []string{a.ks.lock(), a.ks.fence(), a.ks.queue(), a.ks.deadlines(), a.ks.wanted()}
		return fairAcquireScript.Run(ctx, l.client, keys, a.owner, ttl, timeout).Int64()
	case a.o.Unfenced && st != waiting:
		if ok, err := l.client.SetNX(ctx, a.ks.lock(), a.owner, a.o.TTL).Result(); !ok {
			return -1, err
		}
		return 0, nil
	}
	keys := []string{a.ks.lock(), a.ks.fence()}
	if a.o.Unfenced {
		keys = keys[:1]
	}
	if st == waiting {
		return acquireScript.Run(ctx, l.client, keys, a.owner, ttl, "1").Int64()
	}
	return acquireScript.Run(ctx, l.client, keys, a.owner, ttl).Int64()
}

// newLease is the lease of a grant to owner, made by a call sent at sent:
// the lease's TTL counts from then, before the server granted it.
func (l *Locker) newLease(a acquisition, owner string, fence uint64, sent time.Time) lockkit.Lease {
	return backend.NewLease(backend.Grant{
		Key: a.key, Fence: fence, TTL: a.o.TTL, Watchdog: a.watchdog, Sent: sent,
		Extend:  func(ctx context.Context, ttl time.Duration) error { return l.extend(ctx, a.ks, owner, ttl) },
		Release: func(ctx context.Context) error { return l.release(ctx, a.ks, owner, a.o.Fair) },
		Closed:  l.closing.Done(),
	})
}

// extend is a lease's Extend. The watchdog's renewals run on their own
// goroutine: Close ends one in flight and waits for it, so that the caller
// may close the client once Close returns.
func (l *Locker) extend(ctx context.Context, ks keyset, owner string, ttl time.Duration) error {
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
}

// release is a lease's Release: a plain lease hands the key to the plain
// waiter at the head here if there is one (handOver), and otherwise frees
// it and tells the waiters, if it was marked (release.lua); a fair one
// names the queue's head (fair_release.lua).
func (l *Locker) release(ctx context.Context, ks keyset, owner string, fair bool) error {
	if !fair {
		if handled, err := l.handOver(ctx, ks, owner); handled {
			return err
		}
	}
	script, keys := releaseScript, []string{ks.lock()}
	if fair {
		script, keys = fairReleaseScript, []string{ks.lock(), ks.queue(), ks.deadlines(), ks.wanted()}
	}
	res, err := script.Run(ctx, l.client, keys, owner).Result()
	// 0: not ours; a plain release answers 1 if freed, a fair one the
	// message it sent.
	next, _ := res.(string)
	freed := err == nil && res != int64(0)
	if freed {
		l.room.freed(ks)
	}
	// Our own waiters need not wait for the message's round trip. Wake
	// them whatever the outcome: the next one here may not have marked the
	// key (it knew the key was held here), and a release that failed or
	// found the lease gone sends nothing.
	l.room.wake(ks, next)
	if err != nil {
		return unavailable(ctx, err)
	}
	if !freed {
		return lockkit.ErrNotHeld
	}
	return nil
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
	res, err := handOverScript.Run(ctx, l.client, []string{ks.lock(), ks.fence()}, owner, to, w.ttl.Milliseconds(), keepMarked).Int64()
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
