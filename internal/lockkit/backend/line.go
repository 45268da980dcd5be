package backend

import (
	"slices"
	"sync"

	"github.com/lockbench/shop/internal/lockkit"
)

// HandOffRun is how many releases of a key in a row a Line turns into an
// immediate try by its head, at first. The next release lets the head wait
// a full poll (MaxDelay) instead: a waiter in another process learns that
// the key is free only by polling, at least once per MaxDelay, so it then
// asks first. Without the bound a process whose line never empties would
// keep the key for ever, since its head, woken at once, always wins that
// race. Eight keeps the yield's gap (usually a remote head's remaining
// poll) to a small share of eight critical sections, and costs a remote
// waiter at most eight critical sections more than its turn.
//
// A yield nobody used (the head's first try after it is granted) doubles
// the run, up to MaxHandOffRun; one somebody used (that try is refused)
// brings it back to HandOffRun. A process alone on a key so loses one
// MaxDelay per MaxHandOffRun hand-offs, not per eight, and a waiter that
// arrives elsewhere waits at most MaxHandOffRun critical sections, then
// HandOffRun while others keep waiting.
const (
	HandOffRun    = 8
	MaxHandOffRun = 128
)

// Line queues a Locker's waiters per key, for stores that cannot wake a
// waiter (set Poller.Line). Waiters of one key stand in arrival order and
// only the head talks to the store: N waiters in a process cost the store
// one poller, not N. The others wait in-process; one that gives up (its
// context, its wait timeout, Close) leaves at once, and if it was the head
// the next one takes over.
//
// A release made through the same Locker (Released) makes the head try at
// once: no poll gap for a hand-off within the process. After a run of
// those the head waits a full poll instead (see HandOffRun).
//
// A head whose turn came because the waiter ahead was granted knows that
// its own process holds the key: it does not ask the store until that
// lease is released or lost (its Lost closes: released, renewal refused,
// or the local deadline passed).
//
// The zero Line is ready to use. It keeps an entry per key while waiters
// stand in it, and after the last one leaves while the lease it was handed
// is held (to count the run of hand-offs); a lease handed over that is
// never released here successfully leaves its key's entry, a few dozen
// bytes, until the key is waited for again.
type Line struct {
	mu   sync.Mutex
	keys map[string]*queue
}

type queue struct {
	places []*place // arrival order; places[0] is the head
	// handOffs counts the releases in a row that made the head try at
	// once; a grant that came from a poll ends the run. run is how many
	// may (0: HandOffRun).
	handOffs, run int
}

type place struct {
	key  string
	turn chan struct{} // closed once the place is head
	// nudge carries a release made here while the place is head: true to
	// try at once, false to yield (wait a full poll). Only the newest
	// counts, so it holds one.
	nudge chan bool
	// Set under Line.mu before turn closes, read after.
	held <-chan struct{} // the Lost of the lease granted to the waiter ahead
	err  error           // the store was unreachable for a head ahead

	// Kept by the head's own goroutine, read in leave: its last try came
	// from a release here (woken); a release yielded to it (yielded), and a
	// try after that was refused (yieldUsed: somebody else took the key).
	woken, yielded, yieldUsed bool
}

// join puts a waiter for key at the end of the line.
func (l *Line) join(key string) *place {
	p := &place{key: key, turn: make(chan struct{}), nudge: make(chan bool, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keys == nil {
		l.keys = make(map[string]*queue)
	}
	q := l.keys[key]
	if q == nil {
		q = &queue{}
		l.keys[key] = q
	}
	q.places = append(q.places, p)
	if len(q.places) == 1 {
		close(p.turn)
	}
	return p
}

// leave takes p out of the line. A head leaving hands the turn on: with
// granted, the lease it was granted, which the next head waits out; with
// outage, the error that ended its wait, which ends the wait of everyone
// behind it too: one prober's verdict on the store is the process's.
func (l *Line) leave(p *place, granted lockkit.Lease, outage error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.keys[p.key]
	i := slices.Index(q.places, p)
	q.places = slices.Delete(q.places, i, i+1)
	if i == 0 && granted != nil {
		q.countGrant(p)
	}
	if len(q.places) == 0 {
		// Two goroutines taking turns empty the line at every hand-off:
		// the run of hand-offs is kept until the key is freed with nobody
		// here waiting (Released), or granted by a poll.
		if q.handOffs == 0 {
			delete(l.keys, p.key)
		}
		return
	}
	if i == 0 {
		q.passTurn(p, granted, outage)
	}
}

// countGrant updates the run of hand-offs for a grant to head, which
// leaves: a grant that came from a poll ends the run; a yield nobody used
// doubles the next run, one somebody used brings it back (see HandOffRun).
func (q *queue) countGrant(head *place) {
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
func (q *queue) passTurn(head *place, granted lockkit.Lease, outage error) {
	next := q.places[0]
	switch {
	case granted != nil:
		// Lost arms the lease's expiry timer: only when someone waits.
		next.held = granted.Lost()
	case outage == nil && head.held != nil && !IsClosed(head.held):
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
// ends a run of such releases (see HandOffRun).
func (l *Line) Released(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.keys[key]
	if q == nil {
		return
	}
	if len(q.places) == 0 {
		delete(l.keys, key) // freed, and nobody here waits: the run is over
		return
	}
	now := q.handOffs < max(q.run, HandOffRun)
	if now {
		q.handOffs++
	} else {
		q.handOffs = 0
	}
	head := q.places[0]
	if head.held != nil && !IsClosed(head.held) {
		// A release closes its lease's Lost before it frees the key, so the
		// head's lease still open means this news is older than the grant
		// the head waits out (a poll won the key before it arrived).
		return
	}
	select {
	case <-head.nudge:
	default:
	}
	head.nudge <- now
}
