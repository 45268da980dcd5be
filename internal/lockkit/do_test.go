package lockkit_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
	"github.com/lockbench/shop/internal/lockkit/local"
)

func TestDoRunsFnUnderTheLockAndReleases(t *testing.T) {
	ctx := context.Background()
	l := local.New()
	defer l.Close()
	err := lockkit.Do(ctx, l, "k", func(ctx context.Context, fence uint64) error {
		if fence == 0 {
			t.Error("fn got fence 0 from a fencing backend")
		}
		if _, err := l.TryAcquire(ctx, "k"); !errors.Is(err, lockkit.ErrNotAcquired) {
			t.Errorf("key not held while fn runs: TryAcquire = %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("key not released after Do: %v", err)
	}
	_ = lease.Release(ctx)
}

func TestDoReturnsFnsErrorAndStillReleases(t *testing.T) {
	ctx := context.Background()
	l := local.New()
	defer l.Close()
	boom := errors.New("boom")
	if err := lockkit.Do(ctx, l, "k", func(context.Context, uint64) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want fn's error", err)
	}
	lease, err := l.TryAcquire(ctx, "k")
	if err != nil {
		t.Fatalf("key not released after fn failed: %v", err)
	}
	_ = lease.Release(ctx)
}

func TestDoReturnsAcquireError(t *testing.T) {
	ctx := context.Background()
	l := local.New()
	defer l.Close()
	held, _ := l.TryAcquire(ctx, "k", lockkit.WithTTL(time.Minute))
	defer held.Release(ctx)
	called := false
	err := lockkit.Do(ctx, l, "k", func(context.Context, uint64) error { called = true; return nil },
		lockkit.WithWaitTimeout(20*time.Millisecond))
	if !errors.Is(err, lockkit.ErrNotAcquired) || called {
		t.Fatalf("Do on a held key = %v (fn called: %v), want ErrNotAcquired without fn", err, called)
	}
}

// The lease is lost while fn runs: fn's context ends with ErrLeaseLost,
// and Do says so even if fn returns nil, since fn's work ran partly
// unlocked.
func TestDoReportsALeaseLostWhileFnRan(t *testing.T) {
	ctx := context.Background()
	l := local.New()
	defer l.Close()
	err := lockkit.Do(ctx, l, "k", func(ctx context.Context, _ uint64) error {
		l.Steal("k") // the watchdog's next renewal finds it gone
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Error("fn's context not cancelled after the lease was lost")
		}
		if cause := context.Cause(ctx); !errors.Is(cause, lockkit.ErrLeaseLost) {
			t.Errorf("fn's context cause = %v, want ErrLeaseLost", cause)
		}
		return nil // fn ignores it, as careless code does
	}, lockkit.WithAutoRenew(60*time.Millisecond))
	if !errors.Is(err, lockkit.ErrLeaseLost) {
		t.Fatalf("Do after fn outlived its lease = %v, want ErrLeaseLost", err)
	}
}

// lateLocker grants leases that were already past their deadline when they
// arrived, as after a long GC pause or a slow reply.
type lateLocker struct{ lockkit.Locker }

func (l lateLocker) Acquire(context.Context, string, ...lockkit.Option) (lockkit.Lease, error) {
	return backend.NewLease(backend.Grant{Key: "k", Fence: 1, TTL: 10 * time.Millisecond, Sent: time.Now().Add(-time.Second),
		Extend:  func(context.Context, time.Duration) error { return lockkit.ErrNotHeld },
		Release: func(context.Context) error { return lockkit.ErrNotHeld }}), nil
}

func TestDoNeverCallsFnWithALostLease(t *testing.T) {
	called := false
	err := lockkit.Do(context.Background(), lateLocker{}, "k", func(context.Context, uint64) error {
		called = true
		return nil
	})
	if called {
		t.Fatal("fn ran with a lease that was lost before Do could call it")
	}
	if !errors.Is(err, lockkit.ErrLeaseLost) {
		t.Fatalf("Do = %v, want ErrLeaseLost", err)
	}
}

// The caller's cancelled request still frees its lock: the release runs
// on a context detached from the caller's.
func TestDoReleasesAfterTheCallerCancelled(t *testing.T) {
	l := local.New()
	defer l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	_ = lockkit.Do(ctx, l, "k", func(context.Context, uint64) error {
		cancel()
		return nil
	}, lockkit.WithTTL(time.Minute))
	lease, err := l.TryAcquire(context.Background(), "k")
	if err != nil {
		t.Fatalf("lock of a cancelled request not released: %v", err)
	}
	_ = lease.Release(context.Background())
}

// recorder records the order in which keys are acquired and released.
type recorder struct {
	lockkit.Locker
	mu     sync.Mutex
	events []string
	fail   string // key whose Acquire fails
}

func (r *recorder) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	r.log("acquire " + key)
	if key == r.fail {
		return nil, lockkit.ErrNotAcquired
	}
	lease, err := r.Locker.Acquire(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	return recordedLease{lease, r}, nil
}

func (r *recorder) log(e string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

type recordedLease struct {
	lockkit.Lease
	r *recorder
}

func (l recordedLease) Release(ctx context.Context) error {
	l.r.log("release " + l.Key())
	return l.Lease.Release(ctx)
}

func TestDoManyLocksSortedUniqueKeysAndReleasesInReverse(t *testing.T) {
	store := local.New()
	defer store.Close()
	r := &recorder{Locker: store}
	err := lockkit.DoMany(context.Background(), r, []string{"b", "a", "c", "a"}, func(_ context.Context, fences map[string]uint64) error {
		if len(fences) != 3 || fences["a"] == 0 || fences["b"] == 0 || fences["c"] == 0 {
			t.Errorf("fences = %v, want one per distinct key", fences)
		}
		r.log("fn")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"acquire a", "acquire b", "acquire c", "fn", "release c", "release b", "release a"}
	if !slices.Equal(r.events, want) {
		t.Fatalf("events %v, want %v", r.events, want)
	}
}

func TestDoManyReleasesWhatItHeldWhenOneKeyFails(t *testing.T) {
	store := local.New()
	defer store.Close()
	r := &recorder{Locker: store, fail: "b"}
	err := lockkit.DoMany(context.Background(), r, []string{"c", "b", "a"}, func(context.Context, map[string]uint64) error {
		t.Error("fn ran without every key")
		return nil
	})
	if !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("DoMany = %v, want ErrNotAcquired", err)
	}
	want := []string{"acquire a", "acquire b", "release a"}
	if !slices.Equal(r.events, want) {
		t.Fatalf("events %v, want %v", r.events, want)
	}
}

// Two DoMany over the same keys in opposite orders never deadlock.
func TestDoManyOppositeOrdersDoNotDeadlock(t *testing.T) {
	store := local.New()
	defer store.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		keys := []string{"x", "y"}
		if i%2 == 1 {
			keys = []string{"y", "x"}
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			errs <- lockkit.DoMany(ctx, store, keys, func(context.Context, map[string]uint64) error { return nil })
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
}

// fn's own error says more than ErrLeaseLost: Do keeps it.
func TestDoKeepsFnsErrorAfterALostLease(t *testing.T) {
	l := local.New()
	defer l.Close()
	boom := errors.New("boom")
	err := lockkit.Do(context.Background(), l, "k", func(ctx context.Context, _ uint64) error {
		l.Steal("k")
		<-ctx.Done()
		return boom
	}, lockkit.WithAutoRenew(60*time.Millisecond))
	if !errors.Is(err, boom) {
		t.Fatalf("Do = %v, want fn's error", err)
	}
}

// fn that stops because its context ended, as a SQL driver does, returns
// context.Canceled, which says only that the context ended: Do answers
// why it ended, ErrLeaseLost, while the caller's own context is alive.
func TestDoNamesTheLostLeaseForFnsCancelledWork(t *testing.T) {
	l := local.New()
	defer l.Close()
	err := lockkit.Do(context.Background(), l, "k", func(ctx context.Context, _ uint64) error {
		l.Steal("k")
		<-ctx.Done()
		return fmt.Errorf("update accounts: %w", ctx.Err())
	}, lockkit.WithAutoRenew(60*time.Millisecond))
	if !errors.Is(err, lockkit.ErrLeaseLost) {
		t.Fatalf("Do = %v, want ErrLeaseLost", err)
	}
}

// Do's watch on the lease ends with fn, and the release stops the lease's
// timers: nothing Do started outlives it.
func TestDoLeavesNoGoroutineBehind(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	l := local.New()
	defer l.Close()
	for range 10 {
		if err := lockkit.Do(context.Background(), l, "k", func(context.Context, uint64) error { return nil }); err != nil {
			t.Fatal(err)
		}
	}
}

// optionsSeen records the options each Acquire was given.
type optionsSeen struct {
	lockkit.Locker
	mu   sync.Mutex
	seen []lockkit.Options
}

func (o *optionsSeen) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	resolved, _ := backend.Resolve(opts)
	o.mu.Lock()
	o.seen = append(o.seen, resolved)
	o.mu.Unlock()
	return o.Locker.Acquire(ctx, key, opts...)
}

func TestDoAndDoManyPassTheirOptionsToEveryAcquire(t *testing.T) {
	store := local.New()
	defer store.Close()
	l := &optionsSeen{Locker: store}
	opts := []lockkit.Option{lockkit.WithTTL(time.Minute), lockkit.WithWaitTimeout(time.Second)}
	noop := func(context.Context, uint64) error { return nil }
	if err := lockkit.Do(context.Background(), l, "k", noop, opts...); err != nil {
		t.Fatal(err)
	}
	if err := lockkit.DoMany(context.Background(), l, []string{"a", "b"}, func(context.Context, map[string]uint64) error { return nil }, opts...); err != nil {
		t.Fatal(err)
	}
	if len(l.seen) != 3 {
		t.Fatalf("%d acquires, want 3", len(l.seen))
	}
	for _, o := range l.seen {
		if o.TTL != time.Minute || o.WaitTimeout != time.Second {
			t.Fatalf("Acquire got %+v, want the caller's TTL and wait timeout", o)
		}
	}
}

func TestDoManyReturnsFnsErrorAndReleasesEveryKey(t *testing.T) {
	store := local.New()
	defer store.Close()
	r := &recorder{Locker: store}
	boom := errors.New("boom")
	err := lockkit.DoMany(context.Background(), r, []string{"b", "a"}, func(context.Context, map[string]uint64) error { return boom })
	if !errors.Is(err, boom) {
		t.Fatalf("DoMany = %v, want fn's error", err)
	}
	want := []string{"acquire a", "acquire b", "release b", "release a"}
	if !slices.Equal(r.events, want) {
		t.Fatalf("events %v, want %v", r.events, want)
	}
}

// Losing any one of the keys cancels fn's context, and DoMany answers
// ErrLeaseLost for the work that ran partly unlocked.
func TestDoManyCancelsFnWhenAnyLeaseIsLost(t *testing.T) {
	l := local.New()
	defer l.Close()
	err := lockkit.DoMany(context.Background(), l, []string{"a", "b"}, func(ctx context.Context, _ map[string]uint64) error {
		l.Steal("a") // the first key, whose Do is the outermost
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Second):
			t.Error("fn's context not cancelled after a lease was lost")
		}
		if cause := context.Cause(ctx); !errors.Is(cause, lockkit.ErrLeaseLost) {
			t.Errorf("fn's context cause = %v, want ErrLeaseLost", cause)
		}
		return nil
	}, lockkit.WithAutoRenew(60*time.Millisecond))
	if !errors.Is(err, lockkit.ErrLeaseLost) {
		t.Fatalf("DoMany = %v, want ErrLeaseLost", err)
	}
	lease, err := l.TryAcquire(context.Background(), "b")
	if err != nil {
		t.Fatalf("the key still held was not released: %v", err)
	}
	_ = lease.Release(context.Background())
}
