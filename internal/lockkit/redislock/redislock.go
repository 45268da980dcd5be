// Package redislock is the lockkit backend on Redis: SET NX PX and a fencing
// token in one Lua script, owner-checked release and extend, and waiters
// that queue in Redis in arrival order, whatever their process: a release
// grants the key to the first live one in the same script and tells it,
// and it claims the grant (docs/backends-redis.md).
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
	//go:embed wait.lua
	waitLua string
	//go:embed next.lua
	nextLua string
	//go:embed release.lua
	releaseLua string
	//go:embed handoff.lua
	handOffLua string
	//go:embed fence.lua
	fenceLua string
	//go:embed tell.lua
	tellLua string
	//go:embed extend.lua
	extendLua string

	// Scripts run with EVALSHA and fall back to EVAL once after a NOSCRIPT
	// (a restarted or failed-over server has an empty script cache). Every
	// script that grants ends with fence.lua; those that hand a free key
	// to the queue's first waiter run next.lua before it and tell.lua
	// after it.
	acquireScript = redis.NewScript(acquireLua + fenceLua + "return token\n")
	waitScript    = redis.NewScript(waitLua + nextLua + fenceLua + tellLua)
	releaseScript = redis.NewScript(releaseLua)
	handOffScript = redis.NewScript(handOffLua + nextLua + fenceLua + tellLua)
	extendScript  = redis.NewScript(extendLua)
)

// DefaultWaiterTimeout is how long a queued waiter that stopped calling in
// (it crashed) keeps its place; a live one calls in every third of it.
const DefaultWaiterTimeout = 3 * time.Second

// DefaultClaimWindow is how long a key granted to a waiter in another
// process stays its own before it claims it: the longest a waiter that
// died after it was granted the key holds it up. A waiter told of its
// grant holds the key while its claim is on the way, with at least half
// the window left (inbox.trusted), so the window is also the stall the
// claim may take on a loaded machine (0.5 s) before the lease is lost.
const DefaultClaimWindow = time.Second

// Option configures a Locker.
type Option func(*Locker)

// WithPrefix namespaces every key, e.g. per service or per test.
func WithPrefix(prefix string) Option { return func(l *Locker) { l.prefix = prefix } }

// WithWaiterTimeout sets how long a silent queued waiter keeps its place.
func WithWaiterTimeout(d time.Duration) Option { return func(l *Locker) { l.waiterTimeout = d } }

// WithClaimWindow sets how long a waiter elsewhere has to claim a key
// granted to it (DefaultClaimWindow).
func WithClaimWindow(d time.Duration) Option { return func(l *Locker) { l.claimWindow = d } }

// Locker is the Redis backend. It is safe for concurrent use; share one per
// process so that its waiters share one subscription connection.
type Locker struct {
	client        redis.UniversalClient
	prefix        string
	waiterTimeout time.Duration
	claimWindow   time.Duration
	inbox         *inbox
	id            string        // random, names this Locker in owner values and its channel
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
	l := &Locker{client: client, waiterTimeout: DefaultWaiterTimeout, claimWindow: DefaultClaimWindow,
		id: hex.EncodeToString(id)}
	for _, opt := range opts {
		opt(l)
	}
	l.closing, l.shutdown = context.WithCancel(context.Background())
	l.inbox = newInbox(client, channelPrefix+l.id, l.claimWindow)
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
// the names derived from it, built only when needed (an uncontended grant
// needs two of them).
type keyset string

func (l *Locker) keys(key string) keyset { return keyset("{" + l.prefix + key + "}") }

func (k keyset) lock() string  { return string(k) }
func (k keyset) fence() string { return string(k) + ":fence" }

// all is every key of the lock, as wait.lua and release.lua take them.
func (k keyset) all() []string {
	return []string{string(k), string(k) + ":fence", string(k) + ":queue", string(k) + ":waiters"}
}

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

// TryAcquire makes one attempt. While others queue for the key it is
// refused: a release grants the key to the first of them at once.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	if !l.enter() {
		return nil, lockkit.ErrClosed
	}
	defer l.inflight.Done()
	lease, _, err := l.attempt(ctx, l.newAcquisition(key, opts))
	if err == nil && lease == nil {
		err = lockkit.ErrNotAcquired
	}
	return lease, err
}

// Acquire waits for key. Refused on arrival, the waiter takes its place in
// the key's queue in Redis, which orders the waiters of every process
// (arrival order), and waits to be told that a release granted it the key
// (wait.go).
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
	// An arrival while others wait here queues at once: its attempt
	// would be refused. The first attempt does without the Locker's
	// closing signal: registering with it costs the uncontended path.
	if !l.inbox.waiting(a.ks) {
		lease, _, err := l.attempt(bounded, a)
		if lease != nil || err != nil {
			return lease, l.waitErr(ctx, bounded, err)
		}
	}
	return l.wait(ctx, bounded, a)
}

// attempt asks Redis for the key once, as an arrival. It returns a lease,
// or how long the holder's lease has left, or an error.
func (l *Locker) attempt(ctx context.Context, a acquisition) (lockkit.Lease, time.Duration, error) {
	sent := time.Now()
	res, err := l.grant(ctx, a)
	if err != nil {
		// The grant may have landed although its reply was lost.
		l.releaseLater(a.ks, a.owner, false)
		return nil, 0, unavailable(ctx, err)
	}
	if res < 0 { // refused: -1 - the holder's pttl (acquire.lua)
		return nil, time.Duration(-1-res) * time.Millisecond, nil
	}
	return l.newLease(a, uint64(res), sent, false), 0, nil
}

// grant runs an arrival's call: the token (0 unfenced) on a grant,
// otherwise -1 - the holder's pttl in ms. An uncontended grant so carries
// no more than it must: a fenced one two keys, an unfenced one is a plain
// SET NX PX.
func (l *Locker) grant(ctx context.Context, a acquisition) (int64, error) {
	if a.o.Unfenced {
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
	return acquireScript.Run(ctx, l.client, keys, a.owner, a.o.TTL.Milliseconds()).Int64()
}

// newLease is the lease of a grant to a.owner, made by a call sent at
// sent: the lease's TTL counts from then, before the server granted it.
// queued tells a grant made from the queue: its release hands on at once
// (handoff.lua), where one made on arrival first tries the uncontended
// release.
func (l *Locker) newLease(a acquisition, fence uint64, sent time.Time, queued bool) lockkit.Lease {
	if a.o.Unfenced {
		fence = 0
	}
	owner := a.owner
	return backend.NewLease(backend.Grant{
		Key: a.key, Fence: fence, TTL: a.o.TTL, Watchdog: a.watchdog, Sent: sent,
		Extend:  func(ctx context.Context, ttl time.Duration) error { return l.extend(ctx, a.ks, owner, ttl) },
		Release: func(ctx context.Context) error { return l.release(ctx, a.ks, owner, queued) },
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

// release is a lease's Release. A lease granted on arrival is released
// as bsm/redislock does (release.lua), unless a waiter marked it; a marked
// one, or one granted from the queue, goes to the queue's first live
// waiter in the same step (handOff).
func (l *Locker) release(ctx context.Context, ks keyset, owner string, queued bool) error {
	if !queued {
		res, err := releaseScript.Run(ctx, l.client, []string{ks.lock()}, owner).Int()
		switch {
		case err != nil:
			return unavailable(ctx, err)
		case res == 0:
			return lockkit.ErrNotHeld
		case res == 1:
			return nil
		}
	}
	return l.handOff(ctx, ks, owner, false)
}

// handOff frees owner's grant and hands the key to the queue's first live
// waiter (handoff.lua); leaving, owner also takes its place out of the
// queue (a waiter that gives up). One of this Locker's own waiters gets
// the key from here (inbox.deliver). It runs on its caller's context
// alone.
func (l *Locker) handOff(ctx context.Context, ks keyset, owner string, leaving bool) error {
	sent := time.Now()
	leave := "0"
	if leaving {
		leave = "1"
	}
	res, err := handOffScript.Run(ctx, l.client, ks.all(), owner, leave).Result()
	if err != nil {
		return unavailable(ctx, err)
	}
	if res == int64(0) {
		return lockkit.ErrNotHeld
	}
	if granted, ok := res.([]any); ok {
		l.handOn(granted, sent)
	}
	return nil
}

// handOn passes a grant a script made to a waiter of this Locker, read
// from its {owner, token} reply, to that waiter. A waiter that left
// meanwhile needs nothing: its leave (release.lua), which comes after
// the grant in Redis, hands the key on.
func (l *Locker) handOn(granted []any, sent time.Time) {
	owner, token, err := parseGrant(granted)
	if err != nil {
		return
	}
	l.inbox.deliver(owner, grant{fence: token, sent: sent})
}

// parseGrant reads a script's {owner, token} reply.
func parseGrant(granted []any) (owner string, token uint64, err error) {
	if len(granted) != 2 {
		return "", 0, fmt.Errorf("redislock: grant reply %v", granted)
	}
	owner, _ = granted[0].(string)
	if token, err = parseToken(granted[1]); err != nil {
		return "", 0, fmt.Errorf("redislock: grant reply %v", granted)
	}
	return owner, token, nil
}

// parseToken reads a token a script replied: an integer or the string of
// its digits (fence.lua).
func parseToken(v any) (uint64, error) {
	switch t := v.(type) {
	case int64:
		return uint64(t), nil
	case string:
		return strconv.ParseUint(t, 10, 64)
	}
	return 0, fmt.Errorf("redislock: token %v", v)
}

// releaseLater releases owner's grant, if any, in the background: a grant
// whose reply was lost, or a waiter's place and whatever it was granted
// meanwhile (leaving). The caller returns at once, whether or not Redis
// answers; Close waits for it, and once closed it runs here and now.
func (l *Locker) releaseLater(ks keyset, owner string, leaving bool) {
	if !l.enter() {
		l.releaseNow(ks, owner, leaving)
		return
	}
	go func() {
		defer l.inflight.Done()
		l.releaseNow(ks, owner, leaving)
	}()
}

// releaseNow runs release on a context of its own (the caller's may be
// the one that just ended), and a short one: 500 ms.
func (l *Locker) releaseNow(ks keyset, owner string, leaving bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	_ = l.handOff(ctx, ks, owner, leaving)
}

// Close ends every wait (waiters get ErrClosed and leave the queues),
// stops the watchdogs and the subscription, and returns once nothing of the
// Locker uses the client any more: a first attempt already sent is not
// interrupted (its caller's context bounds it) and clean-ups get 500 ms.
// A release runs on its caller's context alone. Leases still held expire
// by their TTL.
func (l *Locker) Close() error {
	l.enterMu.Lock()
	l.shutdown()
	l.enterMu.Unlock()
	l.inbox.close()
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
	return l.id + ":" + strconv.FormatUint(l.seq.Add(1), 36)
}

// newWaitingOwner names a waiter's place in a queue: a fresh owner, this
// Locker's claim window and the lease the waiter asks for, in ms (at
// least 1: PX 0 is refused), which a release grants it for (next.lua).
func (l *Locker) newWaitingOwner(ttl time.Duration) string {
	ms := func(d time.Duration) string { return strconv.FormatInt(max(d.Milliseconds(), 1), 10) }
	return l.newOwner() + ":" + ms(l.grantWindow()) + ":" + ms(ttl)
}

// grantWindow is the claim window as a release grants it: whole ms.
func (l *Locker) grantWindow() time.Duration {
	return max(l.claimWindow.Truncate(time.Millisecond), time.Millisecond)
}
