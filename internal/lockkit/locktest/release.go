package locktest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// releaseRetried proves that a Release whose store call did not happen
// (its context had already ended) can be tried again: the second Release
// frees the key, and no Release answers ErrNotHeld while the store still
// holds the grant for this owner.
func (s *suite) releaseRetried(t *testing.T) {
	key := s.key(t)
	a, b := s.open(t), s.open(t)
	// A long TTL: the key must be freed by the retried Release, not by
	// expiry.
	la := mustTry(t, a, key, lockkit.WithTTL(time.Minute))
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	first := la.Release(ended)
	if errors.Is(first, lockkit.ErrNotHeld) {
		t.Fatalf("release with an ended context = %v: the holder was never found not to own the key", first)
	}
	second := la.Release(context.Background())
	switch {
	case first == nil && !errors.Is(second, lockkit.ErrNotHeld):
		t.Fatalf("second release after a successful one = %v, want ErrNotHeld", second)
	case first != nil && second != nil:
		t.Fatalf("release after a failed one (%v) = %v, want nil: the lease must stay releasable", first, second)
	}
	// Well inside the TTL: a release finished in the background may take
	// a moment, an expiry would take a minute.
	lb, err := b.Acquire(context.Background(), key, lockkit.WithWaitTimeout(10*time.Second))
	if err != nil {
		t.Fatalf("Acquire after the retried release = %v: the key is still held", err)
	}
	_ = lb.Release(context.Background())
}
