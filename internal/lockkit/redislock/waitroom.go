package redislock

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
)

// waitRoom is where a process's waiters wait. It keeps one subscription
// connection for all of them and, per key, a queue in arrival order: only
// the head asks Redis, the rest wait their turn. That is how a release wakes
// one waiter per process instead of a herd, and why the goroutine that just
// released cannot barge past those already waiting (Redisson's LockPubSub
// wakes one waiter per message for the same reason).
type waitRoom struct {
	client redis.UniversalClient
	closed <-chan struct{}

	// waiting counts the keys with waiters here, so that the uncontended
	// path (nobody waits) takes no mutex.
	waiting atomic.Int64

	mu     sync.Mutex
	pubsub *redis.PubSub
	rooms  map[string]*keyRoom // by release channel
	// SUBSCRIBEs sent and confirmed per channel: a confirmation that
	// belongs to an earlier, since abandoned subscribe of the same channel
	// must not convince a new waiter that it is already listening.
	sent, seen map[string]int
}

type keyRoom struct {
	queue      []*waiter
	subscribed chan struct{} // closed when Redis confirmed the subscription
	confirmed  bool
}

type waiter struct {
	channel string
	owner   string
	turn    chan struct{} // closed when the waiter reaches the head
	wake    chan struct{} // a release the head should act on
}

func newWaitRoom(client redis.UniversalClient, closed <-chan struct{}) *waitRoom {
	return &waitRoom{client: client, closed: closed, rooms: make(map[string]*keyRoom),
		sent: make(map[string]int), seen: make(map[string]int)}
}

// busy reports whether anyone in this process waits for the key.
func (r *waitRoom) busy(channel string) bool {
	if r.waiting.Load() == 0 {
		return false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rooms[channel] != nil
}

// join queues a waiter and returns once it is at the head of its key's
// queue and the release channel is subscribed, so no release after this
// point can go unnoticed.
func (r *waitRoom) join(ctx context.Context, channel, owner string) (*waiter, error) {
	w := &waiter{channel: channel, owner: owner, turn: make(chan struct{}), wake: make(chan struct{}, 1)}
	r.mu.Lock()
	room := r.rooms[channel]
	if room == nil {
		room = &keyRoom{subscribed: make(chan struct{})}
		r.rooms[channel] = room
		r.waiting.Add(1)
		if err := r.subscribe(ctx, channel); err != nil {
			delete(r.rooms, channel)
			r.waiting.Add(-1)
			r.mu.Unlock()
			return nil, err
		}
	}
	room.queue = append(room.queue, w)
	if len(room.queue) == 1 {
		close(w.turn)
	}
	r.mu.Unlock()

	for _, ready := range []<-chan struct{}{w.turn, room.subscribed} {
		select {
		case <-ready:
		case <-ctx.Done():
			r.leave(w)
			return nil, ctx.Err()
		case <-r.closed:
			r.leave(w)
			return nil, lockkit.ErrClosed
		}
	}
	return w, nil
}

// subscribe sends SUBSCRIBE on the shared connection, opening it first if
// needed. Called with r.mu held so that subscribes and unsubscribes of one
// channel reach Redis in the order they were decided.
func (r *waitRoom) subscribe(ctx context.Context, channel string) error {
	r.sent[channel]++
	if r.pubsub == nil {
		r.pubsub = r.client.Subscribe(ctx, channel)
		go r.dispatch(r.pubsub.ChannelWithSubscriptions())
		return nil
	}
	if err := r.pubsub.Subscribe(ctx, channel); err != nil {
		r.sent[channel]--
		return unavailable(ctx, err)
	}
	return nil
}

// leave takes w out of its queue and hands the turn to the next waiter.
func (r *waitRoom) leave(w *waiter) {
	r.mu.Lock()
	defer r.mu.Unlock()
	room := r.rooms[w.channel]
	if room == nil {
		return
	}
	i := slices.Index(room.queue, w)
	if i < 0 {
		return
	}
	room.queue = slices.Delete(room.queue, i, i+1)
	if len(room.queue) == 0 {
		delete(r.rooms, w.channel)
		r.waiting.Add(-1)
		if r.sent[w.channel] == r.seen[w.channel] {
			delete(r.sent, w.channel)
			delete(r.seen, w.channel)
		}
		if r.pubsub != nil {
			_ = r.pubsub.Unsubscribe(context.Background(), w.channel)
		}
		return
	}
	if i == 0 {
		close(room.queue[0].turn)
	}
}

// wake tells the head waiter of channel that the key was released. next is
// the fair queue's head named by the release; a waiter not named sleeps on.
func (r *waitRoom) wake(channel, next string) {
	if r.waiting.Load() == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	room := r.rooms[channel]
	if room == nil || len(room.queue) == 0 {
		return
	}
	head := room.queue[0]
	if next != "" && next != head.owner {
		return
	}
	select {
	case head.wake <- struct{}{}:
	default:
	}
}

func (r *waitRoom) dispatch(events <-chan any) {
	for ev := range events {
		switch ev := ev.(type) {
		case *redis.Message:
			r.wake(ev.Channel, ev.Payload)
		case *redis.Subscription:
			if ev.Kind != "subscribe" {
				continue
			}
			r.mu.Lock()
			if r.seen[ev.Channel] < r.sent[ev.Channel] {
				r.seen[ev.Channel]++
			}
			room := r.rooms[ev.Channel]
			if room != nil && !room.confirmed && r.seen[ev.Channel] == r.sent[ev.Channel] {
				room.confirmed = true
				close(room.subscribed)
			} else if room != nil && room.confirmed && len(room.queue) > 0 {
				// Subscribed again after a reconnect: a release may have
				// been missed meanwhile, so the head looks again.
				select {
				case room.queue[0].wake <- struct{}{}:
				default:
				}
			}
			r.mu.Unlock()
		}
	}
}

func (r *waitRoom) close() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pubsub != nil {
		_ = r.pubsub.Close() // ends dispatch
	}
}
