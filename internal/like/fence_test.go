package like

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/lockbench/shop/internal/lockkit"
)

// A holder whose lease ran out (token 5) writes after a newer holder
// (token 6) has checked the membership but before it writes. The newer
// holder's check must claim its token, so the stale write is refused;
// otherwise both move the owner's counter for one change of the set.
func TestStaleWriteAfterNewerReadIsFenced(t *testing.T) {
	client := nodeClient(t)
	s := newService(t, client, Options{Locker: lockkit.None()})
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
	s := newService(t, client, Options{Locker: lockkit.None()})
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
