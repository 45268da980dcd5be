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
// short-lived keys (a known complaint of Redisson's users) should lock a bounded set of keys
// (e.g. per account, not per request). With tokens floored at the clock, a
// counter may also be expired once no grant of its key is live: a new one
// starts above it anyway.
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
	line          backend.Line // plain waiters, per key
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
	l.room = newWaitRoom(client, &l.line)
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
func (k keyset) channel() string   { return string(k) + releasedSuffix }

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

// Acquire waits for key. Plain waiters of one process stand in its line
// (backend.Line) in arrival order and only the head asks Redis; fair
// waiters take their place in the key's Redis queue on arrival, so that
// arrival order holds across processes. A waiter wakes on the release message, on a release by
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
	pttl := time.Duration(0)
	if a.o.Fair || !l.line.Waiting(string(a.ks)) {
		lease, holderPTTL, err := l.attempt(bounded, a, arriving)
		if lease != nil || err != nil {
			return lease, l.waitErr(ctx, bounded, err)
		}
		pttl = holderPTTL
	}
	return l.wait(ctx, bounded, a, pttl)
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
		// GET answers the value that refused us: our own owner's, marked
		// or not, when go-redis resent this SET after its reply was lost,
		// which is the grant itself, its TTL as set (acquire.lua).
		held, err := l.client.SetArgs(ctx, a.ks.lock(), a.owner, redis.SetArgs{Mode: "NX", TTL: a.o.TTL, Get: true}).Result()
		switch {
		case err == redis.Nil:
			return 0, nil
		case err != nil:
			return -1, err
		case held == a.owner || held == a.owner+"!":
			return 0, nil
		}
		return -1, nil
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

// release is a lease's Release: a plain lease hands the key to the head
// of the line here if there is one (handOver), and otherwise frees it and
// tells the waiters, if it was marked (release.lua), and the line here
// (Line.Released); a fair one names the queue's head (fair_release.lua).
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
	// Our own waiters need not wait for the message's round trip. Tell
	// them whatever the outcome: the head here may not have marked the key
	// (it knew the key was held here), and a release that failed or found
	// the lease gone sends nothing.
	if freed && !fair {
		l.line.Released(string(ks))
		l.room.wakeFair(ks.channel(), "")
	} else {
		l.room.deliver(ks.channel(), next)
	}
	if err != nil {
		return unavailable(ctx, err)
	}
	if !freed {
		return lockkit.ErrNotHeld
	}
	return nil
}

// free gives up a grant to owner nobody will take: in the background, which
// Close waits for, or, once closed, here and now, as the release that made
// it runs after Close too.
func (l *Locker) free(ks keyset, owner string) {
	if l.enter() {
		l.abandonLater(ks, owner)
		l.inflight.Done()
		return
	}
	l.abandon(ks, owner)
}

// abandonLater leaves the fair queue and frees a grant whose reply was
// lost, in the background: the caller returns at once, whether or not
// Redis answers, and Close waits for it.
func (l *Locker) abandonLater(ks keyset, owner string) {
	l.inflight.Add(1) // the caller's own registration is still held
	go func() {
		defer l.inflight.Done()
		l.abandon(ks, owner)
	}()
}

// abandon runs abandon.lua on a context of its own (the caller's may be
// the one that just ended), and a short one: 500 ms.
func (l *Locker) abandon(ks keyset, owner string) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_ = abandonScript.Run(ctx, l.client, []string{ks.lock(), ks.queue(), ks.deadlines()}, owner, ks.channel()).Err()
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
