package redislock

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// waitRoom is where a process's waiters wait. It keeps one subscription
// connection for all of them and, per key, a queue of plain waiters in
// arrival order: only its head asks Redis, the rest wait their turn. That
// is how a release wakes one plain waiter per process instead of a herd,
// and why the goroutine that just released cannot barge past those already
// waiting (Redisson's LockPubSub wakes one waiter per message for the same
// reason). Fair waiters each keep their own place in the Redis queue, which
// orders them across processes; a release message names the one whose turn
// it is.
//
// A release by this process may hand the key straight to the plain head
// (offer, then settle): the two meet under mu, so that a head that gives up
// meanwhile either has the grant delivered, and frees it as it leaves, or is
// found gone, and the releaser frees it.
//
// The room never waits for Redis to confirm a SUBSCRIBE: the confirmation
// of a channel wakes that channel's waiters, who then look at the key
// again. A release missed before the subscription took effect, or while
// go-redis was reconnecting (it resubscribes on its own), is so noticed
// with the next confirmation, and a confirmation that never comes (its
// connection died) leaves nobody waiting for it.
type waitRoom struct {
	client redis.UniversalClient

	// waiting counts the keys with waiters here, so that the uncontended
	// path (nobody waits) takes no mutex.
	waiting atomic.Int64

	mu         sync.Mutex
	shut       bool
	pubsub     *redis.PubSub
	dispatched chan struct{}       // closed when dispatch has returned
	rooms      map[string]*keyRoom // by release channel
	// runs counts, by release channel, the hand-overs here in a row since
	// a release here last freed the key. Kept apart from rooms: a room
	// goes whenever its queue empties for a moment (two goroutines taking
	// turns empty it at every hand-over), and a run that ended with it
	// would never reach backend.HandOffRun. runsLen keeps the release of
	// a key with no run off the mutex.
	runs    map[string]int
	runsLen atomic.Int64

	// free gives up a handed grant nobody took (Locker.abandonLater).
	free func(ks keyset, owner string)
}

type keyRoom struct {
	queue []*waiter // plain waiters in arrival order; the head acts
	fair  []*waiter // fair waiters; Redis orders them
}

type waiter struct {
	channel string
	owner   string
	fair    bool
	ttl     time.Duration // what a hand-over grants
	turn    chan struct{} // closed when the waiter may act
	wake    chan struct{} // something happened the waiter should look at
	// heldHere is set before turn closes when the turn came from a waiter
	// ahead that was granted the key: the TTL of that grant.
	heldHere time.Duration

	// Under mu: a release is handing the key to the waiter (offered); it
	// left meanwhile (gone); the grant it was handed, not yet taken.
	offered, gone bool
	handed        *handover
}

// handover is a grant a release made to a waiter here.
type handover struct {
	ks    keyset
	owner string // fresh, not the waiter's own: see handover.lua
	fence uint64
	sent  time.Time // when the releaser sent it, before the grant began
}

func newWaitRoom(client redis.UniversalClient, free func(ks keyset, owner string)) *waitRoom {
	return &waitRoom{client: client, rooms: make(map[string]*keyRoom), runs: make(map[string]int), free: free}
}

// busy reports whether any plain waiter here waits for the key.
func (r *waitRoom) busy(ks keyset) bool {
	if r.waiting.Load() == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	room := r.rooms[ks.channel()]
	return room != nil && len(room.queue) > 0
}

// join adds a waiter and returns once it may act: at once for a fair one,
// at the head of its key's queue for a plain one. subscribed reports that
// this join sent the channel's SUBSCRIBE, whose confirmation will wake the
// waiter; otherwise the waiter should look at the key once now, since a
// release may have come before it joined.
func (r *waitRoom) join(ctx context.Context, channel, owner string, fair bool, ttl time.Duration) (w *waiter, subscribed bool, err error) {
	w = &waiter{channel: channel, owner: owner, fair: fair, ttl: ttl, turn: make(chan struct{}), wake: make(chan struct{}, 1)}
	r.mu.Lock()
	if r.shut {
		r.mu.Unlock()
		return nil, false, lockkit.ErrClosed
	}
	room := r.rooms[channel]
	if room == nil {
		if err := r.subscribe(ctx, channel); err != nil {
			r.mu.Unlock()
			return nil, false, err
		}
		room = &keyRoom{}
		r.rooms[channel] = room
		r.waiting.Add(1)
		subscribed = true
	}
	if fair {
		room.fair = append(room.fair, w)
		close(w.turn)
	} else {
		room.queue = append(room.queue, w)
		if len(room.queue) == 1 {
			close(w.turn)
		} else {
			subscribed = false // the turn, when it comes, is news of its own
		}
	}
	r.mu.Unlock()

	select {
	case <-w.turn:
		return w, subscribed, nil
	case <-ctx.Done():
		r.leave(w, 0)
		return nil, false, ctx.Err()
	}
}

// subscribe sends SUBSCRIBE on the shared connection, opening it first if
// needed. Called with r.mu held, so that the subscribes and unsubscribes of
// one channel reach go-redis in the order they were decided.
func (r *waitRoom) subscribe(ctx context.Context, channel string) error {
	if r.pubsub == nil {
		r.pubsub = r.client.Subscribe(ctx)
		r.dispatched = make(chan struct{})
		go r.dispatch(r.pubsub.ChannelWithSubscriptions(), r.dispatched)
	}
	// go-redis keeps the channel in its resubscribe list even if this
	// write fails, and a reconnect sends it again.
	if err := r.pubsub.Subscribe(ctx, channel); err != nil {
		_ = r.pubsub.Unsubscribe(context.Background(), channel)
		return unavailable(ctx, err)
	}
	return nil
}

// leave takes w out of its room and hands the turn to the next waiter.
// granted is the TTL of the grant w leaves with, 0 if none. A grant handed
// to w and not taken is freed.
func (r *waitRoom) leave(w *waiter, granted time.Duration) {
	r.mu.Lock()
	untaken := w.handed
	w.handed, w.gone = nil, w.offered
	r.leaveLocked(w, granted)
	r.mu.Unlock()
	if untaken != nil {
		r.free(untaken.ks, untaken.owner)
	}
}

func (r *waitRoom) leaveLocked(w *waiter, granted time.Duration) {
	room := r.rooms[w.channel]
	if room == nil {
		return
	}
	if w.fair {
		room.fair = slices.DeleteFunc(room.fair, func(x *waiter) bool { return x == w })
	} else if i := slices.Index(room.queue, w); i >= 0 {
		room.queue = slices.Delete(room.queue, i, i+1)
		if i == 0 && len(room.queue) > 0 {
			room.queue[0].heldHere = granted
			close(room.queue[0].turn)
		}
	}
	if len(room.queue) == 0 && len(room.fair) == 0 {
		delete(r.rooms, w.channel)
		r.waiting.Add(-1)
		if r.pubsub != nil {
			// Best effort: once out of go-redis's list, the channel is not
			// resubscribed, whatever becomes of this write.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = r.pubsub.Unsubscribe(ctx, w.channel)
			cancel()
		}
	}
}

// offer returns the waiter a release of ks may hand the key to: the plain
// head, unless fair waiters here wait too (their order is Redis's queue)
// or another release is handing to it already (a stale one, whose lease
// ran out; the script will find the key not its own). keep says the key
// may be handed to it even if a waiter elsewhere marked it: the run of
// hand-overs here is shorter than backend.HandOffRun.
func (r *waitRoom) offer(ks keyset) (w *waiter, keep bool) {
	if r.waiting.Load() == 0 {
		return nil, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	room := r.rooms[ks.channel()]
	if r.shut || room == nil || len(room.queue) == 0 || len(room.fair) > 0 {
		return nil, false
	}
	w = room.queue[0]
	// A TTL under a millisecond would be PX 0, which Redis refuses: such a
	// waiter asks Redis itself and learns so.
	if w.offered || w.handed != nil || w.ttl < time.Millisecond {
		return nil, false
	}
	w.offered = true
	return w, r.runs[w.channel] < backend.HandOffRun
}

// handedOver counts a hand-over here into its key's run.
func (r *waitRoom) handedOver(ks keyset) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.runs[ks.channel()]; !ok {
		r.runsLen.Add(1)
	}
	r.runs[ks.channel()]++
}

// freed ends the key's run: a release here freed it for everyone.
func (r *waitRoom) freed(ks keyset) {
	if r.runsLen.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.runs[ks.channel()]; ok {
		delete(r.runs, ks.channel())
		r.runsLen.Add(-1)
	}
}

// wakeIfHead wakes w if it is still its key's head and has no grant
// waiting: a later head, whose turn came from a grant here, must not ask
// Redis (the mark its refusal sets, acquire.lua, would end the next run).
func (r *waitRoom) wakeIfHead(w *waiter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if room := r.rooms[w.channel]; room != nil && len(room.queue) > 0 && room.queue[0] == w && w.handed == nil {
		signal(w)
	}
}

// settle ends an offer to w with the grant made, nil if none. It reports
// false if w has left meanwhile: a grant is then the caller's to free.
func (r *waitRoom) settle(w *waiter, h *handover) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	w.offered = false
	if w.gone {
		return false
	}
	if h != nil {
		w.handed = h
		signal(w)
	}
	return true
}

// take returns the grant handed to w, if any; w then holds it.
func (r *waitRoom) take(w *waiter) *handover {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := w.handed
	w.handed = nil
	return h
}

// wake passes a release by this process on.
func (r *waitRoom) wake(ks keyset, next string) {
	if r.waiting.Load() == 0 {
		return
	}
	r.deliver(ks.channel(), next)
}

// deliver passes a release of channel on. next is the fair queue's head
// named by the release: only that fair waiter wakes. An empty next (nobody
// queued) wakes the plain head and every fair waiter here.
func (r *waitRoom) deliver(channel, next string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	room := r.rooms[channel]
	if room == nil {
		return
	}
	if next == "" && len(room.queue) > 0 {
		signal(room.queue[0])
	}
	for _, w := range room.fair {
		if next == "" || next == w.owner {
			signal(w)
		}
	}
}

// wakeAll tells every waiter of channel to look at the key again.
func (r *waitRoom) wakeAll(channel string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	room := r.rooms[channel]
	if room == nil {
		return
	}
	if len(room.queue) > 0 {
		signal(room.queue[0])
	}
	for _, w := range room.fair {
		signal(w)
	}
}

func signal(w *waiter) {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

func (r *waitRoom) dispatch(events <-chan any, done chan<- struct{}) {
	defer close(done)
	for ev := range events {
		switch ev := ev.(type) {
		case *redis.Message:
			r.deliver(ev.Channel, ev.Payload)
		case *redis.Subscription:
			// Subscribed, for the first time or again after a reconnect:
			// a release may have gone by unheard.
			if ev.Kind == "subscribe" {
				r.wakeAll(ev.Channel)
			}
		}
	}
}

// close ends the subscription and waits for its goroutine; later joins
// fail with ErrClosed.
func (r *waitRoom) close() {
	r.mu.Lock()
	r.shut = true
	pubsub, dispatched := r.pubsub, r.dispatched
	r.mu.Unlock()
	if pubsub != nil {
		_ = pubsub.Close() // ends dispatch
		<-dispatched
	}
}
