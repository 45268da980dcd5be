package redislock

import (
	"context"
	"maps"
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
// The waiters never wait for go-redis's PubSub: while its connection
// cannot be opened, its own reconnect holds it for the dial and handshake
// timeouts (seconds) and tries again at once, whatever a caller's context
// says. One goroutine of the room (send) sends the SUBSCRIBEs and
// UNSUBSCRIBEs, each as the rooms stand when it is sent, so that those of
// one channel take effect in the order decided. A key is unheard until
// its SUBSCRIBE has gone out: its waiters look at least every unheardPoll
// meanwhile (heard), and send tries a failed one again as often. A failed
// SUBSCRIBE so ends nobody's wait: while Redis answers commands, it is
// weather, and only failed looks at the key count towards an outage.
type waitRoom struct {
	client redis.UniversalClient
	line   *backend.Line // the Locker's plain waiters

	// fairs counts the fair waiters here, so that a release with none
	// takes no mutex.
	fairs atomic.Int64

	mu      sync.Mutex
	shut    bool
	pubsub  *redis.PubSub
	stop    context.CancelFunc  // ends send
	done    sync.WaitGroup      // dispatch and send
	kick    chan struct{}       // a channel changed; buffered 1
	changed map[string]struct{} // channels send is to subscribe or not, as rooms says
	rooms   map[string]*keyRoom // by release channel
}

// keyRoom is who waits here for one key.
type keyRoom struct {
	plain int       // plain waiters: they stand in the Line
	fair  []*waiter // fair waiters; Redis orders them
	heard bool      // its SUBSCRIBE has gone out
}

// waiter is a fair waiter.
type waiter struct {
	owner string
	wake  chan struct{} // something happened the waiter should look at
}

// releasedSuffix turns a lock's name into its release channel's.
const releasedSuffix = ":released"

func newWaitRoom(client redis.UniversalClient, line *backend.Line) *waitRoom {
	return &waitRoom{client: client, line: line, kick: make(chan struct{}, 1),
		changed: make(map[string]struct{}), rooms: make(map[string]*keyRoom)}
}

// enter counts a waiter for ks in, a fair one (w) or a plain one (w nil),
// subscribing to the key's release channel if nobody here waited for it.
// subscribed reports that this call had the SUBSCRIBE sent, whose
// confirmation will wake the waiters; otherwise a waiter should look at
// the key once now, since a release may have come before it entered. It
// fails only once closed, and never waits for Redis.
func (r *waitRoom) enter(ks keyset, w *waiter) (subscribed bool, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.shut {
		return false, lockkit.ErrClosed
	}
	channel := ks.channel()
	room := r.rooms[channel]
	if room == nil {
		r.start()
		room = &keyRoom{}
		r.rooms[channel] = room
		r.change(channel)
		subscribed = true
	}
	if w == nil {
		room.plain++
	} else {
		room.fair = append(room.fair, w)
		r.fairs.Add(1)
	}
	return subscribed, nil
}

// start opens the shared subscription and its goroutines, once; called
// with r.mu held.
func (r *waitRoom) start() {
	if r.pubsub != nil {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	r.pubsub, r.stop = r.client.Subscribe(ctx), stop
	events := r.pubsub.ChannelWithSubscriptions()
	r.done.Add(2)
	go func() { defer r.done.Done(); r.dispatch(events) }()
	go func() { defer r.done.Done(); r.send(ctx) }()
}

// change has send bring channel's subscription in line with the rooms;
// called with r.mu held.
func (r *waitRoom) change(channel string) {
	r.changed[channel] = struct{}{}
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

// send sends the changed channels' SUBSCRIBEs and UNSUBSCRIBEs until the
// room closes, trying failed SUBSCRIBEs again every unheardPoll.
func (r *waitRoom) send(ctx context.Context) {
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		select {
		case <-r.kick:
		case <-retry.C:
		case <-ctx.Done():
			return
		}
		if !r.sendChanged(ctx) {
			retry.Reset(unheardPoll)
		}
	}
}

// sendChanged sends each changed channel's SUBSCRIBE, if a room waits for
// it when sent, or else its UNSUBSCRIBE. A change made meanwhile is sent
// next time. ok is false if a SUBSCRIBE failed: the channel stays changed.
func (r *waitRoom) sendChanged(ctx context.Context) (ok bool) {
	r.mu.Lock()
	channels := slices.Collect(maps.Keys(r.changed))
	clear(r.changed)
	r.mu.Unlock()
	ok = true
	for _, channel := range channels {
		r.mu.Lock()
		room := r.rooms[channel]
		r.mu.Unlock()
		if room == nil {
			// Best effort: once out of go-redis's list, the channel is not
			// resubscribed, whatever becomes of this write.
			_ = r.pubsub.Unsubscribe(ctx, channel)
			continue
		}
		// go-redis keeps the channel in its resubscribe list even if this
		// write fails, but a reconnect made by the failed write itself
		// resubscribes before the channel is added: only a later one would
		// send it. So a failed one is sent again.
		err := r.pubsub.Subscribe(ctx, channel)
		r.mu.Lock()
		if err == nil {
			room.heard = true
		} else if _, again := r.changed[channel]; !again {
			r.changed[channel], ok = struct{}{}, false
		}
		r.mu.Unlock()
	}
	return ok
}

// heard reports whether the waiters here hear ks's release messages, its
// SUBSCRIBE having gone out. A waiter that entered asks it before each
// wait; while false, it looks at least every unheardPoll instead of
// waiting for a message.
func (r *waitRoom) heard(ks keyset) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rooms[ks.channel()].heard
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
	r.change(channel)
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

func (r *waitRoom) dispatch(events <-chan any) {
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

// close ends the subscription and waits for its goroutines; later
// entries fail with ErrClosed.
func (r *waitRoom) close() {
	r.mu.Lock()
	r.shut = true
	pubsub, stop := r.pubsub, r.stop
	r.mu.Unlock()
	if pubsub != nil {
		stop()
		_ = pubsub.Close() // ends dispatch, and a call of send's
		r.done.Wait()
	}
}
