package like

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
)

// A holder whose lease ran out (token 5) writes after a newer holder
// (token 6) has checked the membership but before it writes. The newer
// holder's check must claim its token, so the stale write is refused;
// otherwise both move the owner's counter for one change of the set.
func TestStaleWriteAfterNewerReadIsFenced(t *testing.T) {
	client := nodeClient(t)
	s := newService(t, client, Options{Locking: guard.Locking{Locker: lockkit.None()}})
	ctx := context.Background()
	e := entities(t, s, 1)[0]
	sp := s.strategy.(*spread)
	if err := client.Set(ctx, sp.fence(e), 4, 0).Err(); err != nil { // token 4 wrote last
		t.Fatal(err)
	}

	type writer struct {
		paused, wake chan struct{}
		done         chan error
	}
	var once sync.Map
	sp.beforeWrite = func(ctx context.Context) {
		w := ctx.Value(writerKey{}).(*writer)
		if _, loaded := once.LoadOrStore(w, true); !loaded {
			close(w.paused)
			<-w.wake
		}
	}
	start := func(fence uint64) *writer {
		w := &writer{paused: make(chan struct{}), wake: make(chan struct{}), done: make(chan error, 1)}
		t.Cleanup(func() {
			select {
			case <-w.wake:
			default:
				close(w.wake)
			}
		})
		go func() { w.done <- sp.setFenced(context.WithValue(ctx, writerKey{}, w), e, 1, true, fence) }()
		select {
		case <-w.paused:
		case err := <-w.done:
			t.Fatalf("token %d ended before its write: %v", fence, err)
		}
		return w
	}
	a := start(5)
	b := start(6)
	close(a.wake)
	aErr := <-a.done
	close(b.wake)
	bErr := <-b.done

	if !errors.Is(aErr, lockkit.ErrFenced) {
		t.Errorf("token 5 (stale) wrote after token 6 had checked: %v, want ErrFenced", aErr)
	}
	if bErr != nil {
		t.Errorf("token 6: %v, want success", bErr)
	}
	drift, err := s.Drift(ctx)
	if err != nil || len(drift) != 0 {
		t.Errorf("drift %v (%v), want none: one like, counted once", drift, err)
	}
}

type writerKey struct{}

// The audit must not under-report when reading a liker set fails: an
// error, not a drift computed as if the set were empty.
func TestDriftReportsFailedSetRead(t *testing.T) {
	client := nodeClient(t)
	s := newService(t, client, Options{Locking: guard.Locking{Locker: lockkit.None()}})
	ctx := context.Background()
	e := entities(t, s, 1)[0]
	sp := s.strategy.(*spread)
	// No like yet, so the counter is missing (GET answers nil), and the
	// set's key holds a string: SCARD fails with WRONGTYPE.
	if err := client.Set(ctx, sp.likers(e), "not a set", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if drift, err := s.Drift(ctx); err == nil {
		t.Fatalf("Drift = %v, nil with an unreadable liker set; want an error", drift)
	}
}

// TestResetBetweenACheckAndItsWriteFencesTheWrite: user 1 likes post 1;
// a holder (token 5) then checks for an unlike and finds the like; before
// it writes, an admin reset empties the set and the counter. The holder's
// write from its pre-reset check must be refused: landing, it would take a
// like off a counter that no longer holds it.
func TestResetBetweenACheckAndItsWriteFencesTheWrite(t *testing.T) {
	client := nodeClient(t)
	s := newService(t, client, Options{Locking: guard.Locking{Locker: lockkit.None()}})
	ctx := context.Background()
	e := Entity{Ref: Ref{Type: "post", ID: "1"}, Owner: 1} // in the fixture
	if _, err := s.Register(ctx, e); err != nil {
		t.Fatal(err)
	}
	sp := s.strategy.(*spread)
	if err := sp.setFenced(ctx, e, 1, true, 4); err != nil {
		t.Fatal(err)
	}
	paused, wake := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(wake) }) }
	t.Cleanup(release)
	sp.beforeWrite = func(context.Context) { close(paused); <-wake }
	done := make(chan error, 1)
	go func() { done <- sp.setFenced(ctx, e, 1, false, 5) }()
	select {
	case <-paused:
	case err := <-done:
		t.Fatalf("the unlike ended before its write: %v", err)
	}
	sp.beforeWrite = nil
	if err := s.Reset(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	release()
	if err := <-done; !errors.Is(err, lockkit.ErrFenced) {
		t.Errorf("the unlike checked before the reset: %v, want ErrFenced", err)
	}
	if drift, err := s.Drift(ctx); err != nil || len(drift) != 0 {
		t.Errorf("drift %v (%v), want none", drift, err)
	}
	// The next holder's token (6 on a backend that counts by one) works.
	if err := sp.setFenced(ctx, e, 1, true, 6); err != nil {
		t.Errorf("the next holder after the reset: %v, want success", err)
	}
}
