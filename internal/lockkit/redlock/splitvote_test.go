package redlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redlock"
)

// Contenders racing for a free key can split the masters' votes so that
// none wins a majority. Nobody holds the key then, so a plain
// ErrNotAcquired (which says another holder has it) would be a lie: a
// TryAcquire that gets it must have lost to this round's winner.
func TestTryAcquireRefusedOnlyWhenAnotherHolds(t *testing.T) {
	addrs := masterAddrs(t)
	const contenders, rounds = 4, 50
	lockers := make([]*redlock.Locker, contenders)
	for i := range lockers {
		lockers[i] = redlock.New(dial(t, addrs))
		defer lockers[i].Close()
	}
	for round := range rounds {
		key := fmt.Sprintf("redlock-split:%d:%d", time.Now().UnixNano(), round)
		start := make(chan struct{})
		leases := make([]lockkit.Lease, contenders)
		errs := make([]error, contenders)
		var wg sync.WaitGroup
		for i, l := range lockers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				leases[i], errs[i] = l.TryAcquire(context.Background(), key, lockkit.WithTTL(10*time.Second))
			}()
		}
		close(start)
		wg.Wait()
		winners := 0
		for _, lease := range leases {
			if lease != nil {
				winners++
				defer lease.Release(context.Background())
			}
		}
		if winners > 1 {
			t.Fatalf("round %d: %d winners", round, winners)
		}
		for i, err := range errs {
			switch {
			case err == nil, errors.Is(err, redlock.ErrSplitVote):
			case errors.Is(err, lockkit.ErrNotAcquired) && winners == 0:
				t.Fatalf("round %d: contender %d told ErrNotAcquired (%v) for a key nobody won", round, i, err)
			case !errors.Is(err, lockkit.ErrNotAcquired):
				t.Fatalf("round %d: contender %d: %v", round, i, err)
			}
		}
	}
}
