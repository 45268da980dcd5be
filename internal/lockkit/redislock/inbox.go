package redislock

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
)

// channelPrefix turns a Locker's id into the name of its channel, on
// which releases elsewhere tell its waiters (next.lua).
const channelPrefix = "redislock:"

// inbox is how a Locker's waiters hear from Redis: one subscription, to the
// Locker's own channel, made when it first has a waiter and kept until
// Close. A release that grants a key to a waiter here names it there, and
// one that makes it the next in line names it with a leading '?': one
// message per hand-off reaches the one process it concerns, whatever the
// number of processes and keys. A grant a release here made reaches its
// waiter directly (deliver), with no message.
//
// The waiters never wait for go-redis's PubSub: while its connection
// cannot be opened, its own reconnect holds it for the dial and handshake
// timeouts (seconds) and tries again at once, whatever a caller's context
// says. One goroutine of the inbox (send) sends the SUBSCRIBE, again every
// unheardPoll until it has gone out; meanwhile the waiters look at least
// as often (heard). A confirmation of the subscription, the first or one
// after go-redis reconnected, makes every waiter look: a message may have
// gone by unheard, and a waiter granted a key claims it then.
//
// On a Redis Cluster the inbox also listens on every master (follow): a
// PUBLISH reaches the subscribers on its own node at once, and the other
// nodes over the cluster bus, whose links are written without TCP_NODELAY
// (redis/redis#11869, valkey-io/valkey#1758), so that there a message can
// wait up to 40 ms behind the one before it. Each message then arrives
// once per node listened on; a copy after the first finds its waiter
// gone, or its grant taken or spent (trusted).
type inbox struct {
	client  redis.UniversalClient
	channel string
	// window is how long a waiter told it is next waits before it looks:
	// a little past the claim window of the waiter ahead, so that its look
	// finds that window's end in Redis too.
	window time.Duration

	mu      sync.Mutex
	shut    bool
	sent    bool // the SUBSCRIBE has gone out
	pubsub  *redis.PubSub
	stop    context.CancelFunc       // ends send and follow
	done    sync.WaitGroup           // the inbox's goroutines
	masters map[string]*redis.PubSub // follow's subscriptions, by address
	waiters map[string]*waiter       // by owner
	keys    map[keyset]int           // how many wait here, by key
	// count is len(waiters), read without mu: an arrival on a Locker
	// nobody waits on takes no mutex.
	count atomic.Int64
}

// waiter is one waiting Acquire.
type waiter struct {
	owner   string
	ks      keyset
	news    chan struct{} // look now: granted, or a message may have gone by
	granted chan grant    // a grant a release here made to it
	// next, under inbox.mu, tells the waiter to look once the claim window
	// of the waiter ahead has passed: armed without waking the waiter,
	// which its own grant normally reaches first.
	next *time.Timer
	// refusal, under inbox.mu, is the waiter's latest look that Redis
	// refused.
	refusal refusal
}

// refusal is what a refused look saw: a grant told later is measured
// against it (trusted).
type refusal struct {
	sent         time.Time // when the look was sent
	last         uint64    // the key's last token
	serverMicros uint64    // the server's clock
	wait         time.Duration
}

// grant is a grant made to a waiter by a call of this Locker, or told to
// it by a release elsewhere.
type grant struct {
	fence uint64
	sent  time.Time // when the granting call was sent
	// told: the grant came in a message, to be trusted or not when the
	// waiter takes it (trusted).
	told bool
}

func newInbox(client redis.UniversalClient, channel string, claimWindow time.Duration) *inbox {
	return &inbox{client: client, channel: channel, window: claimWindow + claimWindow/8,
		masters: make(map[string]*redis.PubSub), waiters: make(map[string]*waiter), keys: make(map[keyset]int)}
}

// enter registers a waiter for ks under owner, subscribing the Locker's
// channel if it is not yet. It fails only once closed, and never waits
// for Redis.
func (b *inbox) enter(ks keyset, owner string) (*waiter, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.shut {
		return nil, lockkit.ErrClosed
	}
	if b.pubsub == nil {
		ctx, stop := context.WithCancel(context.Background())
		b.pubsub, b.stop = b.client.Subscribe(ctx), stop
		events := b.pubsub.ChannelWithSubscriptions()
		b.done.Add(2)
		go func() { defer b.done.Done(); b.dispatch(events) }()
		go func() { defer b.done.Done(); b.send(ctx) }()
		if cluster, ok := b.client.(*redis.ClusterClient); ok {
			b.done.Add(1)
			go func() { defer b.done.Done(); b.follow(ctx, cluster) }()
		}
	}
	w := &waiter{owner: owner, ks: ks, news: make(chan struct{}, 1), granted: make(chan grant, 1)}
	b.waiters[owner] = w
	b.keys[ks]++
	b.count.Add(1)
	return w, nil
}

// exit unregisters w; a grant delivered to it later is dropped.
func (b *inbox) exit(w *waiter) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.waiters, w.owner)
	b.count.Add(-1)
	if w.next != nil {
		w.next.Stop()
	}
	if b.keys[w.ks]--; b.keys[w.ks] == 0 {
		delete(b.keys, w.ks)
	}
}

// waiting reports whether a waiter here waits for ks: an arrival then
// queues at once, since the key is held or granted to a waiter.
func (b *inbox) waiting(ks keyset) bool {
	if b.count.Load() == 0 {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.keys[ks] > 0
}

// send sends the SUBSCRIBE until it has gone out or the inbox closes.
func (b *inbox) send(ctx context.Context) {
	for {
		// go-redis keeps the channel in its resubscribe list even if this
		// write fails, but a reconnect made by the failed write itself
		// resubscribes before the channel is added: only a later one would
		// send it. So a failed one is sent again.
		if err := b.pubsub.Subscribe(ctx, b.channel); err == nil {
			b.mu.Lock()
			b.sent = true
			b.mu.Unlock()
			return
		}
		select {
		case <-time.After(unheardPoll):
		case <-ctx.Done():
			return
		}
	}
}

// followEvery is how often follow looks for masters it does not listen
// on yet: after a failover, the promoted replica's messages cross the bus
// until then.
const followEvery = 5 * time.Second

// follow subscribes the channel on every master of cluster where nobody
// listens to it yet (the inbox's own subscription is on one node, which
// go-redis picked), until the inbox closes. It only speeds messages up:
// one that misses them comes over the bus.
func (b *inbox) follow(ctx context.Context, cluster *redis.ClusterClient) {
	for {
		wait := unheardPoll
		if b.heard() {
			_ = cluster.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
				if n, err := m.PubSubNumSub(ctx, b.channel).Result(); err == nil && n[b.channel] == 0 {
					b.listenAt(ctx, m)
				}
				return nil
			})
			wait = followEvery
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return
		}
	}
}

// listenAt subscribes the channel on master m, unless the inbox does
// already or has closed.
func (b *inbox) listenAt(ctx context.Context, m *redis.Client) {
	addr := m.Options().Addr
	b.mu.Lock()
	_, listening := b.masters[addr]
	b.mu.Unlock()
	if listening {
		return
	}
	pubsub := m.Subscribe(ctx)
	if err := pubsub.Subscribe(ctx, b.channel); err != nil {
		_ = pubsub.Close()
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.shut || b.masters[addr] != nil {
		_ = pubsub.Close()
		return
	}
	b.masters[addr] = pubsub
	b.done.Add(1)
	go func() {
		defer b.done.Done()
		for msg := range pubsub.Channel() {
			b.message(msg.Payload)
		}
		// go-redis closed it (the node left the cluster): follow may
		// subscribe there again.
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.masters[addr] == pubsub {
			delete(b.masters, addr)
		}
	}()
}

// heard reports whether the SUBSCRIBE has gone out, so that a waiter may
// count on being told.
func (b *inbox) heard() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sent
}

func (b *inbox) dispatch(events <-chan any) {
	for ev := range events {
		switch ev := ev.(type) {
		case *redis.Message:
			b.message(ev.Payload)
		case *redis.Subscription:
			if ev.Kind == "subscribe" {
				b.tellAll()
			}
		}
	}
}

// message acts on one message on the channel (next.lua, tell.lua).
func (b *inbox) message(payload string) {
	if owner, ok := strings.CutPrefix(payload, "?"); ok {
		b.isNext(owner)
	} else if owner, token, ok := strings.Cut(payload, " "); ok {
		b.granted(owner, token)
	} else {
		b.tell(payload)
	}
}

// tell has owner's waiter look now, if it still waits.
func (b *inbox) tell(owner string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w := b.waiters[owner]; w != nil {
		w.tell()
	}
}

func (b *inbox) tellAll() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, w := range b.waiters {
		w.tell()
	}
}

// refused records a look of w that Redis refused.
func (b *inbox) refused(w *waiter, r refusal) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w.refusal = r
}

// granted hands owner's waiter a grant with token that a release
// elsewhere told, for the waiter to judge when it takes it (trusted).
func (b *inbox) granted(owner, token string) {
	fence, err := strconv.ParseUint(token, 10, 64)
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.waiters[owner]
	switch {
	case w == nil:
	case err != nil:
		w.tell()
	default:
		select {
		case w.granted <- grant{fence: fence, told: true}:
		default:
			w.tell() // a grant waits already: the look sorts them out
		}
	}
}

// trusted reports whether w may hold the key for trust from a told grant
// with token fence, and since when: only a grant made after w's latest
// refused look, whose window Redis then counts from after that look's
// send time. The token says so: it is above the key's last token and at
// least the server's clock that the look saw (fence.lua), and within reach
// of them (a message forged with an absurd token is not taken). And half
// of trust must be left, for the claim to land in. Otherwise the waiter
// looks: that claims a grant still its own, and finds a spent one (its
// message slower than a later look) gone.
func (b *inbox) trusted(w *waiter, fence uint64, trust time.Duration) (since time.Time, ok bool) {
	b.mu.Lock()
	r := w.refusal
	b.mu.Unlock()
	age := time.Since(r.sent)
	if r.sent.IsZero() || age >= trust/2 {
		return time.Time{}, false
	}
	// Tokens rise by one a grant or with the clock, and no server grants
	// once a microsecond: 2 per microsecond since the look, and a second
	// for the clocks, is more than any real token has climbed.
	reach := max(r.last, r.serverMicros) + 2*uint64(age.Microseconds()) + 1e6
	if fence <= r.last || fence < r.serverMicros || fence > reach {
		return time.Time{}, false
	}
	return r.sent, true
}

// isNext has owner's waiter look once the claim window of the waiter
// ahead has passed, unless its own grant comes first.
func (b *inbox) isNext(owner string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.waiters[owner]
	switch {
	case w == nil:
	case w.next == nil:
		w.next = time.AfterFunc(b.window, w.tell)
	default:
		w.next.Reset(b.window)
	}
}

func (w *waiter) tell() {
	select {
	case w.news <- struct{}{}:
	default:
	}
}

// deliver hands g to owner's waiter, if it still waits; otherwise its
// leave, which follows the grant in Redis, hands the key on.
func (b *inbox) deliver(owner string, g grant) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if w := b.waiters[owner]; w != nil {
		select {
		case w.granted <- g:
		default:
		}
	}
}

// close ends the subscription and waits for its goroutines; later
// entries fail with ErrClosed.
func (b *inbox) close() {
	b.mu.Lock()
	b.shut = true
	pubsub, stop := b.pubsub, b.stop
	masters := slices.Collect(maps.Values(b.masters))
	b.mu.Unlock()
	if pubsub != nil {
		stop()
		_ = pubsub.Close() // ends dispatch, and a call of send's
		for _, m := range masters {
			_ = m.Close()
		}
		b.done.Wait()
	}
}
