package redislock

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// waitRoom is what a Locker's waiters share of Redis's pub/sub: one
// subscription connection, subscribed to a key's release channel while
// anybody here waits for the key, and the fair waiters. Plain waiters
// stand in the Locker's line (backend.Line), whose head alone asks Redis:
// a message for them is news for that head (Line.Wake). Fair waiters each
// keep their own place in the key's Redis queue, which orders them across
// processes; a release message names the one whose turn it is.
//
// The room never waits for Redis to confirm a SUBSCRIBE: the confirmation
// of a channel wakes that channel's waiters, who then look at the key
// again. A release missed before the subscription took effect, or while
// go-redis was reconnecting (it resubscribes on its own), is so noticed
// with the next confirmation, and a confirmation that never comes (its
// connection died) leaves nobody waiting for it.
//
// A SUBSCRIBE that fails (one lost reply, a reset) ends nobody's wait
// either: while Redis answers commands, one failure of the subscription
// is weather, and only failed looks at the key count towards an outage.
// The key stays unheard, and the waiters that look at it send the
// SUBSCRIBE again when they do (heard), looking at least every
// unheardPoll until one goes out.
type waitRoom struct {
	client redis.UniversalClient
	line   *backend.Line // the Locker's plain waiters

	// fairs counts the fair waiters here, so that a release with none
	// takes no mutex.
	fairs atomic.Int64

	mu         sync.Mutex
	shut       bool
	pubsub     *redis.PubSub
	dispatched chan struct{}       // closed when dispatch has returned
	rooms      map[string]*keyRoom // by release channel
}

// keyRoom is who waits here for one key.
type keyRoom struct {
	plain   int       // plain waiters: they stand in the Line
	fair    []*waiter // fair waiters; Redis orders them
	unheard bool      // its SUBSCRIBE failed and has not been sent since
}

// waiter is a fair waiter.
type waiter struct {
	owner string
	wake  chan struct{} // something happened the waiter should look at
}

// releasedSuffix turns a lock's name into its release channel's.
const releasedSuffix = ":released"

func newWaitRoom(client redis.UniversalClient, line *backend.Line) *waitRoom {
	return &waitRoom{client: client, line: line, rooms: make(map[string]*keyRoom)}
}

// enter counts a waiter for ks in, a fair one (w) or a plain one (w nil),
// subscribing to the key's release channel if nobody here waited for it.
// subscribed reports that this call sent the SUBSCRIBE, whose confirmation
// will wake the waiters; otherwise a waiter should look at the key once
// now, since a release may have come before it entered, or nobody hears
// the next one (a failed SUBSCRIBE). It fails only once closed.
func (r *waitRoom) enter(ctx context.Context, ks keyset, w *waiter) (subscribed bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shut {
		return false, lockkit.ErrClosed
	}
	channel := ks.channel()
	room := r.rooms[channel]
	if room == nil {
		room = &keyRoom{unheard: r.subscribe(ctx, channel) != nil}
		r.rooms[channel] = room
		subscribed = !room.unheard
	}
	if w == nil {
		room.plain++
	} else {
		room.fair = append(room.fair, w)
		r.fairs.Add(1)
	}
	return subscribed, nil
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
	// write fails, but a reconnect made by the failed write itself
	// resubscribes before the channel is added: only a later one would
	// send it. So the room sends it again itself (heard), and exit takes
	// it off the list.
	return r.pubsub.Subscribe(ctx, channel)
}

// heard reports whether the waiters here hear ks's release messages, its
// SUBSCRIBE having been sent: before, or now, if it had failed. A waiter
// that entered asks it before each wait; while false, it looks at least
// every unheardPoll instead of waiting for a message.
func (r *waitRoom) heard(ctx context.Context, ks keyset) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	room := r.rooms[ks.channel()]
	if room.unheard {
		room.unheard = r.subscribe(ctx, ks.channel()) != nil
	}
	return !room.unheard
}

// exit counts a waiter that entered out, unsubscribing once nobody here
// waits for the key.
func (r *waitRoom) exit(ks keyset, w *waiter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	channel := ks.channel()
	room := r.rooms[channel]
	if w == nil {
		room.plain--
	} else {
		i := slices.Index(room.fair, w)
		room.fair = slices.Delete(room.fair, i, i+1)
		r.fairs.Add(-1)
	}
	if room.plain > 0 || len(room.fair) > 0 {
		return
	}
	delete(r.rooms, channel)
	if r.pubsub != nil {
		// Best effort: once out of go-redis's list, the channel is not
		// resubscribed, whatever becomes of this write.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_ = r.pubsub.Unsubscribe(ctx, channel)
		cancel()
	}
}

// fairWaiting reports whether a fair waiter here waits for ks.
func (r *waitRoom) fairWaiting(ks keyset) bool {
	if r.fairs.Load() == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	room := r.rooms[ks.channel()]
	return room != nil && len(room.fair) > 0
}

// deliver passes a release of channel on. next is the fair queue's head
// named by the release: only that fair waiter wakes. An empty next (nobody
// queued) is news for the plain head and wakes every fair waiter here.
func (r *waitRoom) deliver(channel, next string) {
	if next == "" {
		r.line.Wake(strings.TrimSuffix(channel, releasedSuffix))
	}
	r.wakeFair(channel, next)
}

// wakeFair wakes the fair waiter named next, or all of them if next is
// empty.
func (r *waitRoom) wakeFair(channel, next string) {
	if r.fairs.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	room := r.rooms[channel]
	if room == nil {
		return
	}
	for _, w := range room.fair {
		if next == "" || next == w.owner {
			select {
			case w.wake <- struct{}{}:
			default:
			}
		}
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
				r.deliver(ev.Channel, "")
			}
		}
	}
}

// close ends the subscription and waits for its goroutine; later entries
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
