package locktest

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

func (s *suite) mutualExclusion(t *testing.T) {
	lockers := []lockkit.Locker{s.open(t), s.open(t), s.open(t), s.open(t)}
	const goroutines, iterations = 32, 5
	c := Contend(t, lockers, s.key(t), goroutines, iterations, lockkit.WithAutoRenew(s.h.TTL))
	if c.Overlaps != 0 || c.Lost != 0 {
		t.Fatalf("two holders at once: %d critical sections entered while another was inside, %d of %d increments lost",
			c.Overlaps, c.Lost, goroutines*iterations)
	}
	if c.LeasesLost > 0 {
		t.Logf("%d leases lost while their holder was inside (a loaded machine), none overlapped", c.LeasesLost)
	}
}

// Contention is what Contend saw.
type Contention struct {
	// Overlaps counts critical sections entered while another was inside:
	// any at all means two holders at once, even if no update was lost.
	Overlaps int
	// Lost counts the increments that overlapping sections overwrote.
	Lost int
	// LeasesLost counts sections whose lease was lost before they ended
	// (Do's ErrLeaseLost): slow, but exclusive unless Overlaps says not.
	LeasesLost int
}

// Contend runs goroutines that each increment an unprotected counter
// iterations times under key, spread over lockers, all released at once.
// A lock yields a zero Contention; lockkit.None shows what the lock
// prevents.
func Contend(t testing.TB, lockers []lockkit.Locker, key string, goroutines, iterations int, opts ...lockkit.Option) Contention {
	t.Helper()
	var (
		// Atomic loads and stores keep the race detector quiet; the
		// load-sleep-store cycle still loses updates without a lock.
		counter atomic.Int64
		inside  atomic.Int32
		overlap atomic.Int32
		// leasesLost counts sections Do reported ErrLeaseLost for.
		leasesLost atomic.Int32
		start      = make(chan struct{})
		wg         sync.WaitGroup
		errs       = make(chan error, goroutines)
	)
	for g := range goroutines {
		wg.Go(func() {
			l := lockers[g%len(lockers)]
			<-start
			for done := 0; done < iterations; {
				ran := false
				err := lockkit.Do(context.Background(), l, key, func(context.Context, uint64) error {
					ran = true
					if inside.Add(1) > 1 {
						overlap.Add(1)
					}
					v := counter.Load()
					time.Sleep(100 * time.Microsecond) // widen the window a lost update needs
					counter.Store(v + 1)
					inside.Add(-1)
					return nil
				}, opts...)
				if ran {
					done++
				}
				switch {
				case errors.Is(err, lockkit.ErrLeaseLost):
					// Not handed over (ran is false: try again), or lost
					// while inside: whether another holder came in
					// meanwhile is for the overlap count to say.
					if ran {
						leasesLost.Add(1)
					}
				case err != nil:
					errs <- err
					return
				}
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("Do: %v", err)
	}
	return Contention{Overlaps: int(overlap.Load()), Lost: goroutines*iterations - int(counter.Load()),
		LeasesLost: int(leasesLost.Load())}
}
