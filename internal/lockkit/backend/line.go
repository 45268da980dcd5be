package backend

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// HandOffRun is how many releases of a key in a row a Line turns into an
// immediate try by its head, at first. The next
// release makes the head yield instead: it leaves the key to the waiters
// in other processes for a while (Pace.Yield), since they learn that the
// key is free only later than the head here (a poll, a message), and
// would otherwise never ask first. Without the bound a process whose line
// never empties would keep the key for ever, since its head, told at
// once, always wins that race. Eight keeps the yield's gap to a small
// share of eight critical sections, and costs a remote waiter at most
// eight critical sections more than its turn.
//
// A yield nobody used (the head's first try after it is granted) doubles
// the run, up to MaxHandOffRun; one somebody used (that try is refused),
// or one the store told everyone about (Wake), brings it back to
// HandOffRun. A process alone on a key so loses one yield per
// MaxHandOffRun hand-offs, not per eight, and a waiter that arrives
// elsewhere waits at most MaxHandOffRun critical sections, then
// HandOffRun while others keep waiting.
const (
	HandOffRun    = 8
	MaxHandOffRun = 128
)

// Line is a Locker's in-process queue of waiters, per key. The words:
//
//   - A waiter takes a place in the key's line (Join); the places stand in
//     arrival order, and the first is the head. Only the head talks to the
//     store: N waiters in a process cost the store one asker, not N. A
//     place's turn comes when it becomes the head (Turn).
//   - A waiter that gives up (its context, its wait timeout, Close) leaves
//     at once (Leave); if it was the head, the next one takes over. A head
//     that leaves granted tells the next one that the key is held here:
//     the next head waits out that lease (held) and does not ask the store
//     until it is released or lost, since its refusal would be certain
//     (and, on Redis, would mark the key for a release message). A head
//     that leaves with an outage ends the wait of everyone then behind it:
//     one asker's verdict on the store is the process's.
//   - A release through the same Locker nudges the head (Released): it
//     tries at once. A run of such hand-offs is bounded (HandOffRun): the
//     release that ends it makes the head yield.
//   - News from the store (Wake: a release message, a subscription that
//     may have missed one) makes the head look at once, and counts in no
//     run.
//
// How long a head waits between looks is its Pace (Sleep): a polling
// store's poll, a store that tells its waiters only a fallback.
//
// The zero Line is ready to use. It keeps an entry per key while places
// stand in it, and after the last one leaves while the lease it was
// granted is held (to count the run); a lease that is never released here
// successfully leaves its key's entry, a few dozen bytes, until the key is
// waited for again.
type Line struct {
	mu   sync.Mutex
	keys map[string]*queue
	// queues is len(keys), read without mu: a Locker nobody waits on
	// answers Waiting and Offer without the mutex.
	queues atomic.Int64
}

type queue struct {
	places []*Place // arrival order; places[0] is the head
	// handOffs counts the releases in a row that made the head try at
	// once; a grant that came otherwise ends the run. run is how many may
	// (0: HandOffRun).
	handOffs, run int
}

// nudge is what a Locker tells its head between two looks at the store.
type nudge uint8

const (
	tryNow nudge = iota + 1 // a release here the run allows
	yield                   // a release here that ends a run
	news                    // the store says the key may be free (Wake)
)

// Place is a waiter's place in a Line.
type Place struct {
	key   string
	ttl   time.Duration
	turn  chan struct{} // closed once the place is head
	nudge chan nudge    // only the newest counts, so it holds one
	timer *time.Timer   // Sleep's, made on first use
	// heldOut is set by the head's goroutine once it stops waiting out held.
	heldOut bool
	// Set under Line.mu before turn closes, read after.
	held <-chan struct{} // the Lost of the lease granted to the waiter ahead
	err  error           // the store was unreachable for a head ahead

	// Kept by the head's own goroutine, read in Leave: its last look came
	// from a release here (woken); a release yielded to it (yielded), and
	// somebody else had the key or was told of it (yieldUsed).
	woken, yielded, yieldUsed bool
}

// Join puts a waiter for key at the end of the line. ttl is the lease it
// asks for.
func (l *Line) Join(key string, ttl time.Duration) *Place {
	p := &Place{key: key, ttl: ttl, turn: make(chan struct{}), nudge: make(chan nudge, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keys == nil {
		l.keys = make(map[string]*queue)
	}
	q := l.keys[key]
	if q == nil {
		q = &queue{}
		l.keys[key] = q
		l.queues.Add(1)
	}
	q.places = append(q.places, p)
	if len(q.places) == 1 {
		close(p.turn)
	}
	return p
}

// Turn is closed once p is the head. Then Outage and Held are set.
func (p *Place) Turn() <-chan struct{} { return p.turn }

// Outage is the error that ended the wait of a head ahead of p, which
// ends p's wait too; nil if none. Read it once Turn is closed.
func (p *Place) Outage() error { return p.err }

// Held reports whether p's turn came because the waiter ahead was granted
// the key, and that lease still holds it: the head should not ask the
// store (Sleep waits it out).
func (p *Place) Held() bool { return p.held != nil && !IsClosed(p.held) }

// TTL is the lease p asks for.
func (p *Place) TTL() time.Duration { return p.ttl }

// Refused notes that the head's look at the store was refused: if it
// yielded just before, somebody else used the yield.
func (p *Place) Refused() { p.yieldUsed = p.yielded }

// Waiting reports whether any waiter stands in key's line.
func (l *Line) Waiting(key string) bool {
	if l.queues.Load() == 0 {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.keys[key]
	return q != nil && len(q.places) > 0
}

// Leave takes p out of the line. A head leaving hands the turn on: with
// granted, the lease it was granted, which the next head waits out; with
// outage, the error that ended its wait, which ends the wait of everyone
// behind it too.
func (l *Line) Leave(p *Place, granted lockkit.Lease, outage error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p.err != nil {
		// Inherited: those behind p were told with it; who joined since
		// tries for itself.
		outage = nil
	}
	q := l.keys[p.key]
	i := slices.Index(q.places, p)
	q.places = slices.Delete(q.places, i, i+1)
	if i == 0 && granted != nil {
		q.countGrant(p)
	}
	if len(q.places) == 0 {
		// Two goroutines taking turns empty the line at every hand-off:
		// the run is kept until the key is freed with nobody here
		// waiting (Released), or granted otherwise.
		if q.handOffs == 0 {
			l.drop(p.key)
		}
		return
	}
	if i == 0 {
		q.passTurn(p, granted, outage)
	}
}

func (l *Line) drop(key string) {
	delete(l.keys, key)
	l.queues.Add(-1)
}

// countGrant updates the run for a grant to head, which leaves: a grant
// that came otherwise than from a release here ends the run; a yield
// nobody used doubles the next run, one somebody used brings it back (see
// HandOffRun).
func (q *queue) countGrant(head *Place) {
	if !head.woken {
		q.handOffs = 0
	}
	switch {
	case head.yielded && head.yieldUsed:
		q.run = HandOffRun
	case head.yielded:
		q.run = min(2*max(q.run, HandOffRun), MaxHandOffRun)
	}
}

// passTurn makes the next waiter head after head left, telling it what
// head leaves it: the lease granted here to wait out, or the outage that
// ends everyone's wait.
func (q *queue) passTurn(head *Place, granted lockkit.Lease, outage error) {
	next := q.places[0]
	switch {
	case granted != nil:
		// Lost arms the lease's expiry timer: only when someone waits.
		next.held = granted.Lost()
	case outage == nil && head.Held():
		// A head that gives up while its process holds the key passes on
		// what it waited for: the next head need not ask the store either.
		next.held = head.held
	}
	if outage != nil {
		for _, w := range q.places {
			w.err = outage
		}
	}
	close(next.turn)
}

// Released tells the line that key was just freed by an owner-checked
// release through the same Locker: its head tries at once, unless this
// ends a run (see HandOffRun): then it yields.
func (l *Line) Released(key string) {
	if l.queues.Load() == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.keys[key]
	if q == nil {
		return
	}
	if len(q.places) == 0 {
		l.drop(key) // freed, and nobody here waits: the run is over
		return
	}
	n := yield
	if q.handOffs < max(q.run, HandOffRun) {
		n = tryNow
		q.handOffs++
	} else {
		q.handOffs = 0
	}
	q.tell(n)
}

// Wake passes news from the store on to key's head: the key may be free
// (a release message, a subscription that may have missed one, a release
// here that failed). The head looks at once; the run is not counted.
func (l *Line) Wake(key string) {
	if l.queues.Load() == 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if q := l.keys[key]; q != nil && len(q.places) > 0 {
		q.tell(news)
	}
}

// tell nudges the head, unless it waits out a lease granted here: a
// release closes its lease's Lost before it frees the key, so that lease
// still open means this news is older than the grant the head waits out.
func (q *queue) tell(n nudge) {
	head := q.places[0]
	if head.Held() {
		return
	}
	select {
	case <-head.nudge:
	default:
	}
	head.nudge <- n
}
