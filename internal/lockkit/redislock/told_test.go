package redislock_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

// claimGate holds back a client's extends (extend.lua, which is how a
// waiter told of its grant claims it) until open is closed; held closes
// once one waits there.
type claimGate struct {
	*scriptHook
	open, held chan struct{}
}

func newClaimGate(t *testing.T) *claimGate {
	g := &claimGate{scriptHook: newScriptHook(t, "extend.lua"), open: make(chan struct{}), held: make(chan struct{})}
	var once sync.Once
	g.before = func(ctx context.Context) error {
		once.Do(func() { close(g.held) })
		select {
		case <-g.open:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return g
}

// A waiter in another process told of its grant holds the key from the
// message on: its Acquire returns while its claim has not reached Redis,
// with a token above the last holder's. Redis keeps the key its own for
// the claim window meanwhile, and once the claim lands, for its lease.
func TestToldGrantIsHeldBeforeItsClaimLands(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	const window = 2 * time.Second
	holder := newLocker(t, newClient(t, addr))
	gate := newClaimGate(t)
	waiterClient := newClient(t, addr)
	waiterClient.AddHook(gate)
	waiter := newLocker(t, waiterClient, redislock.WithClaimWindow(window))
	admin := newClient(t, addr)
	ctx := context.Background()
	key := uniqueKey(t)

	told, held, owner := toldGrant(t, holder, waiter, admin, key)
	defer told.Release(ctx)
	select {
	case <-gate.held:
	case <-time.After(10 * time.Second):
		t.Fatal("no claim was sent after the told grant")
	}
	if told.Fence() <= held.Fence() {
		t.Errorf("token %d, not above the last holder's %d", told.Fence(), held.Fence())
	}
	lock := "{" + testPrefix + key + "}"
	if pttl := admin.PTTL(ctx, lock).Val(); pttl <= 0 || pttl > window {
		t.Fatalf("before the claim, Redis keeps the grant %v; want at most the claim window %v", pttl, window)
	}
	close(gate.open)
	waitUntil(t, func() bool { return admin.PTTL(ctx, lock).Val() > window })
	if v := admin.Get(ctx, lock).Val(); strings.TrimSuffix(v, "!") != owner {
		t.Fatalf("the key is %q, not the waiter's %q", v, owner)
	}
	select {
	case <-told.Lost():
		t.Fatal("the claimed lease is lost")
	default:
	}
}

// A told grant's claim answered late, as on a loaded machine (its
// reply held back 300 ms here), does not cost the lease: the default
// claim window leaves more than that for it.
func TestToldGrantOutlivesASlowClaim(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	const replyDelay = 300 * time.Millisecond
	claims := newScriptHook(t, "extend.lua")
	claimed := make(chan struct{})
	var once sync.Once
	claims.after = func() { time.Sleep(replyDelay); once.Do(func() { close(claimed) }) }
	waiterClient := newClient(t, addr)
	waiterClient.AddHook(claims)
	holder := newLocker(t, newClient(t, addr))
	waiter := newLocker(t, waiterClient)
	admin := newClient(t, addr)
	ctx := context.Background()
	key := uniqueKey(t)

	told, _, _ := toldGrant(t, holder, waiter, admin, key)
	defer told.Release(ctx)
	lost := told.Lost()
	select {
	case <-claimed:
	case <-lost:
		t.Fatalf("the told lease was lost while its claim's reply was %v late", replyDelay)
	case <-time.After(10 * time.Second):
		t.Fatal("no claim was answered after the told grant")
	}
	time.Sleep(10 * time.Millisecond) // the reply settles the lease
	if backend.IsClosed(lost) {
		t.Fatalf("the told lease was lost while its claim's reply was %v late", replyDelay)
	}
}

// A told grant whose claim does not land in time is lost by the end of
// the window its lease trusted, and the waiter behind it is granted only
// after that: Redis's window outlasts the lease's trust.
func TestToldGrantWithoutClaimIsLostBeforeTheNextGrant(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	// Long enough that the waiter's look before its grant leaves half of
	// it, on a slow machine too: a look older than that claims before
	// Acquire returns.
	const window = 2 * time.Second
	holder := newLocker(t, newClient(t, addr))
	gate := newClaimGate(t)
	defer close(gate.open)
	stuckClient := newClient(t, addr)
	stuckClient.AddHook(gate)
	stuck := newLocker(t, stuckClient, redislock.WithClaimWindow(window))
	next := newLocker(t, newClient(t, addr))
	ctx := context.Background()
	key := uniqueKey(t)

	held := hold(t, holder, key)
	admin := newClient(t, addr)
	first := acquireAsync(stuck, ctx, key, lockkit.WithWaitTimeout(10*time.Second))
	queueHead(t, admin, key)
	second := acquireAsync(next, ctx, key, lockkit.WithWaitTimeout(10*time.Second))
	queued(t, admin, key, 2)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-first
	if a.err != nil {
		t.Fatalf("told waiter: %v", a.err)
	}
	lost := make(chan time.Time, 1)
	go func() { <-a.lease.Lost(); lost <- time.Now() }()

	b := <-second
	if b.err != nil {
		t.Fatalf("waiter behind the unclaimed grant: %v", b.err)
	}
	defer b.lease.Release(ctx)
	select {
	case at := <-lost:
		if !at.Before(b.at) {
			t.Errorf("the unclaimed lease was trusted until %v, past the next grant at %v", at, b.at)
		}
	default:
		t.Fatal("the next waiter was granted while the unclaimed lease was still trusted")
	}
}

// A grant message slower than a later look of its waiter, or one that
// names a token the waiter's look saw already, is spent: the waiter does
// not take it, and looks instead.
func TestStaleGrantMessageIsNotTaken(t *testing.T) { grantMessageIsNotTaken(t, "1") }

// grantMessageIsNotTaken publishes a grant with token to a waiter while
// the key is held: the waiter must not take it, and is granted the key
// once its holder lets go.
func grantMessageIsNotTaken(t *testing.T, token string) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	admin := newClient(t, addr)
	holder := newLocker(t, newClient(t, addr))
	waiter := newLocker(t, newClient(t, addr))
	ctx := context.Background()
	key := uniqueKey(t)

	held := hold(t, holder, key)
	got := acquireAsync(waiter, ctx, key, lockkit.WithWaitTimeout(10*time.Second))
	owner := queueHead(t, admin, key)
	if err := admin.Publish(ctx, channelOf(owner), owner+" "+token).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-got:
		t.Fatalf("a grant message with token %s was taken: %+v", token, a)
	case <-time.After(300 * time.Millisecond):
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil {
		t.Fatalf("waiter: %v", a.err)
	}
	_ = a.lease.Release(ctx)
}

// toldGrant has holder, which holds key, let it go once waiter (a Locker
// of its own) queues for it: the grant reaches the waiter by message. It
// returns the waiter's lease, the holder's released one and the waiter's
// owner.
func toldGrant(t *testing.T, holder, waiter *redislock.Locker, admin *redis.Client, key string, opts ...lockkit.Option) (told, released lockkit.Lease, owner string) {
	t.Helper()
	ctx := context.Background()
	held := hold(t, holder, key)
	got := acquireAsync(waiter, ctx, key, append([]lockkit.Option{lockkit.WithWaitTimeout(10 * time.Second)}, opts...)...)
	owner = queueHead(t, admin, key)
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil {
		t.Fatalf("told waiter: %v", a.err)
	}
	return a.lease, held, owner
}

// channelOf is the channel on which releases tell owner's Locker.
func channelOf(owner string) string { return "redislock:" + strings.Split(owner, ":")[0] }

// queueHead waits for a waiter to queue for key and returns its owner
// (queued).
func queueHead(t *testing.T, admin *redis.Client, key string) string {
	t.Helper()
	return queued(t, admin, key, 1)[0]
}

// queued waits for n waiters to queue for key, each of a Locker whose
// channel is subscribed (a release's message reaches it), and returns
// their owners in queue order.
func queued(t *testing.T, admin *redis.Client, key string, n int) []string {
	t.Helper()
	ctx := context.Background()
	var owners []string
	waitUntil(t, func() bool {
		owners = admin.LRange(ctx, "{"+testPrefix+key+"}:queue", 0, -1).Val()
		if len(owners) < n {
			return false
		}
		for _, o := range owners[:n] {
			channel := channelOf(o)
			if admin.PubSubNumSub(ctx, channel).Val()[channel] == 0 {
				return false
			}
		}
		return true
	})
	return owners[:n]
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// scriptHook runs around a client's calls of one script, composed of
// files as redislock composes it: before ahead of each call (an error
// ends the call), after behind its reply.
type scriptHook struct {
	sha, src string
	before   func(ctx context.Context) error
	after    func()
}

func newScriptHook(t *testing.T, files ...string) *scriptHook {
	var src strings.Builder
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		src.Write(b)
	}
	sum := sha1.Sum([]byte(src.String()))
	return &scriptHook{sha: hex.EncodeToString(sum[:]), src: src.String()}
}

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if args := cmd.Args(); len(args) < 2 || (args[1] != h.sha && args[1] != h.src) {
			return next(ctx, cmd)
		}
		if h.before != nil {
			if err := h.before(ctx); err != nil {
				return err
			}
		}
		err := next(ctx, cmd)
		if h.after != nil {
			h.after()
		}
		return err
	}
}

// A told grant's lease shorter than the claim window: its claim cuts the
// key's TTL in Redis to the lease's as it lands, so the lease may trust no
// more than its TTL while the claim's reply is on its way (held back here
// 400 ms). Another Locker that takes the key once it expired finds the
// told lease lost.
func TestToldGrantTrustsNoLongerThanItsLease(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	const window, ttl, replyDelay = time.Second, 50 * time.Millisecond, 400 * time.Millisecond
	claims := newScriptHook(t, "extend.lua")
	claims.after = func() { time.Sleep(replyDelay) }
	waiterClient := newClient(t, addr)
	waiterClient.AddHook(claims)
	holder := newLocker(t, newClient(t, addr))
	waiter := newLocker(t, waiterClient, redislock.WithClaimWindow(window))
	other := newLocker(t, newClient(t, addr))
	admin := newClient(t, addr)
	ctx := context.Background()
	key := uniqueKey(t)

	told, _, _ := toldGrant(t, holder, waiter, admin, key, lockkit.WithTTL(ttl))
	for granted := time.Now(); time.Since(granted) < replyDelay; time.Sleep(2 * time.Millisecond) {
		if l, err := other.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute)); err == nil {
			defer l.Release(ctx)
			if !backend.IsClosed(told.Lost()) {
				t.Fatalf("another Locker was granted the key %v after the told grant while the told lease (TTL %v, its claim's reply held back) was still trusted",
					time.Since(granted), ttl)
			}
			return
		}
	}
}

// A told grant whose message came while its waiter's next look was on its
// way, slowly (here: 400 ms, past the grant's 250 ms window): the look is
// refused (another Locker took the key once the window ran out), and the
// grant it followed is spent. Acquire must not return it as a lease, lost
// from the start; the waiter waits on and is granted the key once the
// other lets go.
func TestToldGrantSpentDuringASlowLookIsNotTaken(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	const window = 250 * time.Millisecond
	looks := newScriptHook(t, "wait.lua", "next.lua", "fence.lua", "tell.lua")
	var slowNext atomic.Bool // the next look reaches Redis window+150ms late
	looks.before = func(context.Context) error {
		if slowNext.CompareAndSwap(true, false) {
			time.Sleep(window + 150*time.Millisecond)
		}
		return nil
	}
	waiterClient := newClient(t, addr)
	waiterClient.AddHook(looks)
	holder := newLocker(t, newClient(t, addr))
	waiter := newLocker(t, waiterClient, redislock.WithClaimWindow(window))
	other := newLocker(t, newClient(t, addr))
	admin := newClient(t, addr)
	ctx := context.Background()
	key := uniqueKey(t)

	held := hold(t, holder, key)
	got := acquireAsync(waiter, ctx, key, lockkit.WithTTL(time.Minute), lockkit.WithWaitTimeout(10*time.Second))
	owner := queueHead(t, admin, key)
	// A bare owner has the waiter look: that look is the slow one.
	slowNext.Store(true)
	if err := admin.Publish(ctx, channelOf(owner), owner).Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond)
	if err := held.Release(ctx); err != nil { // told while the look is on its way
		t.Fatal(err)
	}
	time.Sleep(window + 20*time.Millisecond)
	taken, err := other.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
	if err != nil {
		t.Fatalf("the key after the unclaimed window: %v", err)
	}
	select {
	case a := <-got:
		t.Fatalf("Acquire returned while another Locker holds the key: lease lost %v, err %v", a.lease != nil && backend.IsClosed(a.lease.Lost()), a.err)
	case <-time.After(window + 300*time.Millisecond):
	}
	if err := taken.Release(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-got
	if a.err != nil {
		t.Fatalf("the waiter after the key was let go: %v", a.err)
	}
	defer a.lease.Release(ctx)
	if backend.IsClosed(a.lease.Lost()) || a.lease.Fence() <= taken.Fence() {
		t.Fatalf("the waiter's lease: lost %v, token %d after %d", backend.IsClosed(a.lease.Lost()), a.lease.Fence(), taken.Fence())
	}
}

// A message that names a waiter with a token out of any real grant's
// reach (forged: the largest token there is) is not taken: a fenced store
// that saw it would refuse every real holder after it.
func TestGrantWithAnAbsurdTokenIsNotTaken(t *testing.T) {
	grantMessageIsNotTaken(t, "18446744073709551615")
}
