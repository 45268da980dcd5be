package locktest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// The tests in this file watch or cut a client's connections through a
// Wire (Harness.Wired).

// handful is the most calls a waiter that is woken by the server may make
// in pollWindow: keepalives and pings, not attempts. A poller with the
// usual 10-50 ms delay makes dozens.
const (
	handful    = 20
	pollWindow = 2 * time.Second
)

// overrun is how long after its deadline an operation against a silent
// server may return: scheduling noise on a loaded machine (1.47 s was seen
// for a 1 s deadline with the load at 15 per core), and still well short
// of the network timeouts the harnesses' clients use (go-redis reads for
// 3 s), which a waiter that ignored its deadline would sit out.
const overrun = time.Second

func (s *suite) wired(t *testing.T) (lockkit.Locker, *Wire) {
	t.Helper()
	s.requireWired(t)
	w := NewWire(t)
	l := s.h.Wired(t, w)
	// Registered after the wire's own cleanup, so it runs first; tests
	// heal the wire before they end so that Close is not silenced.
	t.Cleanup(func() { _ = l.Close() })
	return l, w
}

func (s *suite) requireWired(t *testing.T) {
	t.Helper()
	if s.h.Wired == nil {
		t.Fatal("Harness.Wired is required: the suite counts a client's calls and silences its server through it")
	}
}

// waitWithoutPolling counts the calls a client makes while it waits
// behind a holder: a handful if the backend wakes waiters, many more if
// it polls.
func (s *suite) waitWithoutPolling(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	waiter, w := s.wired(t)
	lh := mustTry(t, s.open(t), key, lockkit.WithTTL(30*time.Second))
	granted := make(chan error, 1)
	go func() {
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		lease, err := waiter.Acquire(wctx, key, lockkit.WithTTL(30*time.Second))
		if err == nil {
			_ = lease.Release(ctx)
		}
		granted <- err
	}()
	time.Sleep(500 * time.Millisecond) // connected, and queued or subscribed
	calls, bytes := w.Calls(), w.Bytes()
	select {
	case err := <-granted:
		t.Fatalf("Acquire of a held key returned: %v", err)
	case <-time.After(pollWindow):
	}
	calls, bytes = w.Calls()-calls, w.Bytes()-bytes
	if err := lh.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-granted:
		if err != nil {
			t.Fatalf("waiter after the release: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("waiter not granted 10s after the release")
	}
	t.Logf("a waiter made %d calls (%d bytes) in %v behind a holder (WaitNoPoll declared: %v)",
		calls, bytes, pollWindow, s.caps.WaitNoPoll)
	switch {
	case s.caps.WaitNoPoll && calls > handful:
		t.Fatalf("backend declares waiting without polling, but a waiter made %d calls in %v (at most %d expected)",
			calls, pollWindow, handful)
	case !s.caps.WaitNoPoll && calls <= handful:
		t.Fatalf("backend declares that it polls, but a waiter made only %d calls in %v: declare WaitNoPoll", calls, pollWindow)
	}
}

// cancelOnSilentServer: a waiter's deadline holds while the server has
// gone silent (a partition, a paused VM), not only while it answers.
func (s *suite) cancelOnSilentServer(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	waiter, w := s.wired(t)
	defer w.Heal()
	lh := mustTry(t, s.open(t), key, lockkit.WithTTL(30*time.Second))
	defer lh.Release(ctx)
	const deadline = time.Second
	wctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	result := make(chan error, 1)
	go func() {
		lease, err := waiter.Acquire(wctx, key, lockkit.WithTTL(30*time.Second))
		if lease != nil {
			_ = lease.Release(ctx)
		}
		result <- err
	}()
	time.Sleep(deadline / 3) // waiting
	w.BlackHole()
	select {
	case err := <-result:
		took := time.Since(start)
		if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, lockkit.ErrUnavailable) {
			t.Fatalf("Acquire on a silent server = %v, want its deadline's error or ErrUnavailable", err)
		}
		if took > deadline+overrun {
			t.Fatalf("Acquire with a %v deadline returned after %v on a silent server", deadline, took)
		}
	case <-time.After(deadline + 10*time.Second):
		t.Fatalf("Acquire with a %v deadline still waiting after %v on a silent server", deadline, time.Since(start))
	}
}

// releaseWhileRenewalHangs: Release is bounded by its own context, also
// while the watchdog's renewal hangs on a silent server.
func (s *suite) releaseWhileRenewalHangs(t *testing.T) {
	ctx := context.Background()
	key := s.key(t)
	l, w := s.wired(t)
	defer w.Heal()
	ttl := max(3*time.Second, 6*s.h.TTL)
	lease := mustTry(t, l, key, lockkit.WithAutoRenew(ttl))
	time.Sleep(ttl / 6)
	w.BlackHole()
	time.Sleep(ttl / 3) // past the renewal due at ttl/3, which hangs
	const budget = 100 * time.Millisecond
	rctx, cancel := context.WithTimeout(ctx, budget)
	defer cancel()
	start := time.Now()
	err := lease.Release(rctx)
	if took := time.Since(start); took > budget+overrun {
		t.Fatalf("Release with a %v context took %v while a renewal hung (%v)", budget, took, err)
	}
	if !backend.IsClosed(lease.Lost()) {
		t.Fatal("Lost still open after Release returned")
	}
}

// extendRacingWatchdog: an Extend that shortens the lease while the
// watchdog's renewal is in flight must not leave the holder trusting the
// longer deadline after the store applied the shorter one. The renewal's
// reply is held so that the two requests overlap; then the server is
// silenced and another client waits for the grant to end.
func (s *suite) extendRacingWatchdog(t *testing.T) {
	ctx := context.Background()
	long, short := 4*s.h.TTL, s.h.TTL
	other := s.open(t)
	for round := range 3 {
		key := fmt.Sprintf("%s:%d", s.key(t), round)
		l, w := s.wired(t)
		// Several connections open before any reply is held, so that
		// the Extend need not wait for a handshake behind the hold.
		var warm sync.WaitGroup
		for i := range 4 {
			warm.Go(func() {
				if lease, err := l.TryAcquire(ctx, fmt.Sprintf("%s:warm%d", key, i)); err == nil {
					_ = lease.Release(ctx)
				}
			})
		}
		warm.Wait()
		lease := mustTry(t, l, key, lockkit.WithAutoRenew(long))
		time.Sleep(long / 6)
		sent := w.Calls()
		w.HoldReplies()
		// The renewal due at long/3 reaches the server; its reply waits.
		for end := time.Now().Add(long/3 + 2*time.Second); w.Calls() == sent && time.Now().Before(end); {
			time.Sleep(5 * time.Millisecond)
		}
		extended := make(chan error, 1)
		go func() { extended <- lease.Extend(ctx, short) }()
		time.Sleep(50 * time.Millisecond)
		w.HealRepliesNewestFirst()
		if err := <-extended; err != nil {
			// A backend with short call timeouts may give up on the
			// held replies: the Extend's outcome is then unknown to the
			// holder, which must still not outlast the server's grant.
			t.Logf("round %d: Extend: %v", round, err)
		}
		// Nothing more reaches the server: it ends the grant at the TTL
		// it applied last, and the holder must have stopped trusting it.
		w.BlackHole()
		lo := mustAcquire(t, other, key, lockkit.WithTTL(30*time.Second))
		select {
		case <-lease.Lost():
		case <-time.After(short): // timer noise; the defect trusts long-short = 3 TTLs too long
			t.Fatalf("round %d: another client was granted the key while its former holder's Lost was open: two holders", round)
		}
		_ = lo.Release(ctx)
		w.Heal()
	}
}

// ignoreWire leaves out the wire's own goroutines, which serve the
// connections until the test ends.
var ignoreWire = []goleak.Option{
	goleak.IgnoreAnyFunction("github.com/lockbench/shop/internal/lockkit/locktest.(*Wire).accept"),
	goleak.IgnoreAnyFunction("github.com/lockbench/shop/internal/lockkit/locktest.(*Wire).forward"),
	goleak.IgnoreAnyFunction("github.com/lockbench/shop/internal/lockkit/locktest.(*Wire).pump"),
}

// closeRacingAcquire: Close while Acquires are starting to wait leaves no
// goroutine behind. The client under the Locker stays open, as a process's
// shared client does, so a subscription the Locker forgot shows up. In
// the held rounds the Acquires' first attempts reach the server and their
// replies wait until Close has run, so each Acquire goes on to wait on a
// closed Locker; the other rounds close at a few moments by the clock.
func (s *suite) closeRacingAcquire(t *testing.T) {
	s.requireWired(t)
	ctx := context.Background()
	key := s.key(t)
	lh := mustTry(t, s.open(t), key, lockkit.WithTTL(30*time.Second))
	defer lh.Release(ctx)
	for round := range 6 {
		held := round%2 == 0
		w := NewWire(t)
		l := s.h.Wired(t, w)
		t.Cleanup(func() { _ = l.Close() })
		warm := mustTry(t, l, key+":warm", lockkit.WithTTL(30*time.Second))
		_ = warm.Release(ctx)
		before := goleak.IgnoreCurrent()
		sent := w.Calls()
		if held {
			w.HoldReplies()
		}
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				if lease, err := l.Acquire(wctx, key, lockkit.WithTTL(30*time.Second)); err == nil {
					_ = lease.Release(ctx)
					t.Error("Acquire granted a held key")
				}
			})
		}
		if held {
			for end := time.Now().Add(time.Second); w.Calls() == sent && time.Now().Before(end); {
				time.Sleep(time.Millisecond)
			}
			closing := make(chan struct{})
			go func() { _ = l.Close(); close(closing) }()
			time.Sleep(20 * time.Millisecond)
			w.Heal()
			<-closing
		} else {
			time.Sleep(time.Duration(round) * time.Millisecond)
			_ = l.Close()
		}
		returned := make(chan struct{})
		go func() { wg.Wait(); close(returned) }()
		select {
		case <-returned:
		case <-time.After(10 * time.Second):
			t.Fatalf("round %d: Acquires still waiting 10s after Close", round)
		}
		if err := goleak.Find(append(ignoreWire, before)...); err != nil {
			t.Fatalf("round %d (replies held: %v): Close racing 4 Acquires left goroutines behind: %v", round, held, err)
		}
	}
}
