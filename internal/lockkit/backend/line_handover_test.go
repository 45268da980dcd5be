package backend

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// heldLease is a lease granted here whose release only closes its Lost.
func heldLease() lockkit.Lease {
	return NewLease(Grant{Key: "k", TTL: time.Hour,
		Extend:  func(context.Context, time.Duration) error { return nil },
		Release: func(context.Context) error { return nil }})
}

// sleepAsync runs p.Sleep and reports its end.
func sleepAsync(p *Place, wait time.Duration, pace Pace) <-chan error {
	done := make(chan error, 1)
	go func() { done <- p.Sleep(context.Background(), context.Background(), wait, pace) }()
	return done
}

func awaitSleep(t *testing.T, done <-chan error, what string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: the head still sleeps", what)
	}
}

func nudged(p *Place) nudge {
	select {
	case n := <-p.nudge:
		return n
	default:
		return 0
	}
}

// A release here hands the key straight to the head for a run of
// HandOffRun, each head taking the grant and leaving with it, the next
// one waiting that lease out; the release after the run may not keep the
// key from waiters elsewhere, and if it frees it (Released) the head
// yields.
func TestLineHandOversCountInTheRun(t *testing.T) {
	var l Line
	head := l.Join("k", time.Minute)
	for i := range HandOffRun {
		next := l.Join("k", time.Minute)
		p, keep := l.Offer("k")
		if p != head || !keep {
			t.Fatalf("offer %d: head %v keep %v, want the head and keep", i+1, p == head, keep)
		}
		if p.TTL() != time.Minute {
			t.Fatalf("offered head asks for %v, want a minute", p.TTL())
		}
		if !l.HandOver(p, i+1) {
			t.Fatalf("hand-over %d to a head still in line refused", i+1)
		}
		if nudged(head) != tryNow {
			t.Fatalf("hand-over %d did not nudge the head", i+1)
		}
		if g := l.Take(head); g != i+1 {
			t.Fatalf("head took %v, want grant %d", g, i+1)
		}
		lease := heldLease()
		if untaken := l.Leave(head, lease, nil); untaken != nil {
			t.Fatalf("a head that took its grant left %v untaken", untaken)
		}
		if !next.Held() {
			t.Fatal("the next head does not wait out the lease granted here")
		}
		_ = lease.Release(context.Background())
		head = next
	}
	if p, keep := l.Offer("k"); p != head || keep {
		t.Fatalf("offer after a run of %d: keep %v, want the run spent", HandOffRun, keep)
	}
	l.HandOver(head, nil) // the store freed the key for all instead
	l.Released("k")
	if n := nudged(head); n != yield {
		t.Fatalf("release that ended the run nudged %d, want a yield", n)
	}
	if untaken := l.Leave(head, nil, nil); untaken != nil {
		t.Fatalf("untaken %v with nothing handed", untaken)
	}
}

// A grant made to a head that left is refused, for the releaser to give
// up; one made before it left comes back from Leave.
func TestLineHandOverToHeadThatLeftIsNotLost(t *testing.T) {
	var l Line
	p := l.Join("k", time.Minute)
	if head, _ := l.Offer("k"); head != p {
		t.Fatal("no head offered")
	}
	if head, _ := l.Offer("k"); head != nil {
		t.Fatal("a head already offered was offered again")
	}
	l.Leave(p, nil, nil)
	if l.HandOver(p, "grant") {
		t.Fatal("a grant to a head that left was taken in")
	}

	p = l.Join("k", time.Minute)
	head, _ := l.Offer("k")
	if !l.HandOver(head, "grant") {
		t.Fatal("hand-over to a head in line refused")
	}
	if untaken := l.Leave(p, nil, nil); untaken != "grant" {
		t.Fatalf("a head leaving before it took its grant returned %v, want the grant", untaken)
	}
	if l.Waiting("k") {
		t.Fatal("line still waiting after everyone left")
	}
}

// News from the store makes a sleeping head look at once, and is no step
// of the run: a head granted after it ends the run.
func TestLineWakeIsNewsNotAHandOff(t *testing.T) {
	var l Line
	p := l.Join("k", time.Minute)
	done := sleepAsync(p, time.Hour, Pace{Yield: time.Hour})
	l.Wake("k")
	awaitSleep(t, done, "after news from the store")
	if p.woken {
		t.Fatal("news counted as a release here")
	}
	l.Leave(p, heldLease(), nil)
	if l.Waiting("k") || len(l.keys) != 0 {
		t.Fatal("a grant after news kept a run going")
	}
}

// A head that waits out a lease granted here ignores news until that
// lease ends: a message older than the grant would make it ask the store
// and be refused.
func TestLineWakeWaitsForTheLeaseHeldHere(t *testing.T) {
	var l Line
	first := l.Join("k", time.Minute)
	p := l.Join("k", time.Minute)
	lease := heldLease()
	l.Leave(first, lease, nil)
	done := sleepAsync(p, time.Millisecond, Pace{AfterHeld: func() time.Duration { return time.Hour }})
	l.Wake("k")
	select {
	case <-done:
		t.Fatal("head woke on news while the lease it waits out holds the key")
	case <-time.After(50 * time.Millisecond):
	}
	_ = lease.Release(context.Background())
	l.Wake("k") // the release's own news
	awaitSleep(t, done, "after the lease held here was released")
}

// A yield ends early with news from the store, which everyone heard: the
// head then races the waiters elsewhere on equal terms, and winning that
// race does not double the run.
func TestLineNewsEndsAYieldAndKeepsTheRunShort(t *testing.T) {
	var l Line
	p := l.Join("k", time.Minute)
	l.mu.Lock()
	l.keys["k"].handOffs = HandOffRun
	l.mu.Unlock()
	l.Released("k") // ends the run: a yield
	done := sleepAsync(p, time.Hour, Pace{Yield: time.Hour})
	time.Sleep(20 * time.Millisecond) // yielding
	l.Wake("k")
	awaitSleep(t, done, "yielding head after news")
	second := l.Join("k", time.Minute)
	l.Leave(p, heldLease(), nil)
	if run := l.keys["k"].run; run != HandOffRun {
		t.Fatalf("run after a yield ended by news: %d, want %d", run, HandOffRun)
	}
	l.Leave(second, nil, nil)
}

// An outage ends the wait of those in line when the head found it, not of
// those who joined since: a place that inherited it and leaves with it,
// as a backend passes on whatever ended its wait, tells nobody.
func TestLineOutageReachesOnlyThoseThenInLine(t *testing.T) {
	var l Line
	head, told := l.Join("k", time.Second), l.Join("k", time.Second)
	down := errors.New("store down")
	l.Leave(head, nil, down)
	<-told.Turn()
	if told.Outage() != down {
		t.Fatalf("the place behind the head has outage %v, want %v", told.Outage(), down)
	}
	later := l.Join("k", time.Second)
	l.Leave(told, nil, told.Outage())
	<-later.Turn()
	if err := later.Outage(); err != nil {
		t.Errorf("a place that joined after the outage was found inherited %v", err)
	}
	l.Leave(later, nil, nil)
}
