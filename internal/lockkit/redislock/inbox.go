package redislock

import (
	"context"
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
type inbox struct {
	client  redis.UniversalClient
	channel string
	// claimWindow is how long Redis keeps a key granted to a waiter here
	// before the waiter claims it (next.lua).
	claimWindow time.Duration
	// window is how long a waiter told it is next waits before it looks:
	// a little past the claim window of the waiter ahead, so that its look
	// finds that window's end in Redis too.
	window time.Duration

	mu      sync.Mutex
	shut    bool
	sent    bool // the SUBSCRIBE has gone out
	pubsub  *redis.PubSub
	stop    context.CancelFunc // ends send
	done    sync.WaitGroup     // dispatch and send
	waiters map[string]*waiter // by owner
	keys    map[keyset]int     // how many wait here, by key
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
	// looked and last, under inbox.mu, are the send time of the waiter's
	// latest look that Redis refused and the key's last token then.
	looked time.Time
	last   uint64
}

// grant is a grant made to a waiter by a call of this Locker, or told to
// it by a release elsewhere.
type grant struct {
	fence uint64
	sent  time.Time // when a call was sent, before the grant began
	// told: the grant came in a message; Redis keeps it for the claim
	// window, which the waiter claims in the background (claimLater).
	told bool
}

func newInbox(client redis.UniversalClient, channel string, claimWindow time.Duration) *inbox {
	return &inbox{client: client, channel: channel, claimWindow: claimWindow, window: claimWindow + claimWindow/8,
		waiters: make(map[string]*waiter), keys: make(map[keyset]int)}
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
			if owner, ok := strings.CutPrefix(ev.Payload, "?"); ok {
				b.isNext(owner)
			} else if owner, token, ok := strings.Cut(ev.Payload, " "); ok {
				b.granted(owner, token)
			} else {
				b.tell(ev.Payload)
			}
		case *redis.Subscription:
			if ev.Kind == "subscribe" {
				b.tellAll()
			}
		}
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

// refused records a look of w that Redis refused: sent at sent, it saw
// last as the key's last token.
func (b *inbox) refused(w *waiter, sent time.Time, last uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	w.looked, w.last = sent, last
}

// granted hands owner's waiter the key a release elsewhere granted it
// with token, when the grant is known to have come after the waiter's
// latest refused look (its token is above the one that look saw, so the
// window Redis keeps it for runs past the look's send time) and that
// look was recent enough for half the claim window to be left. Otherwise
// the waiter looks: that claims a grant still its own, and finds a spent
// one (a message slower than a later look) gone.
func (b *inbox) granted(owner, token string) {
	fence, err := strconv.ParseUint(token, 10, 64)
	b.mu.Lock()
	defer b.mu.Unlock()
	w := b.waiters[owner]
	switch {
	case w == nil:
	case err != nil || fence <= w.last || time.Since(w.looked) > b.claimWindow/2:
		w.tell()
	default:
		select {
		case w.granted <- grant{fence: fence, sent: w.looked, told: true}:
		default:
		}
	}
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
	b.mu.Unlock()
	if pubsub != nil {
		stop()
		_ = pubsub.Close() // ends dispatch, and a call of send's
		b.done.Wait()
	}
}
