package order

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
)

// LeaderKey is the closer's leader lease: every instance runs the closer
// loop, only the holder of this key runs a round (a job that runs on
// exactly one node at a time). With the none backend every instance holds
// it, and the audit shows what that costs.
var LeaderKey = lockkey.OrderCloser.Key()

// closeBatch bounds the orders one round reads; the next round takes the
// rest.
const closeBatch = 100

// interval is the time between two closer rounds: a tenth of the pay
// timeout, so that an order is cancelled soon after its deadline, between
// 100 ms and 30 s.
func (s *Service) interval() time.Duration {
	return min(max(s.o.PayTimeout/10, 100*time.Millisecond), 30*time.Second)
}

// RunCloser runs the closer loop until ctx ends: every interval it tries
// the leader lease and, if it gets it, runs one round and lets it go. The
// lease is held for a round, never between rounds: on some backends a
// held lease is a held resource (on mysql-forupdate an open transaction,
// which stops InnoDB's purge for the whole server while it lasts). During
// a long round the watchdog renews it; when it is lost (the lock server
// says it is gone, or this process stalled past it), the round stops at
// once (its context is cancelled). A change already inside its
// transaction finishes, and its fence decides whether it lands.
func (s *Service) RunCloser(ctx context.Context, log *slog.Logger) {
	leading := false
	for ctx.Err() == nil {
		err := lockkit.Do(ctx, tryOnly{s.o.Locker}, LeaderKey.String(), func(ctx context.Context, fence uint64) error {
			if !leading {
				log.Info("order closer: leading", "key", LeaderKey.String(), "fence", fence, "interval", s.interval())
				leading = true
			}
			_, err := s.CloseExpired(ctx, log)
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			return err
		}, lockkit.WithAutoRenew(s.o.LeaderTTL))
		if ctx.Err() != nil {
			return
		}
		switch {
		case leading && (errors.Is(err, lockkit.ErrNotAcquired) || errors.Is(err, lockkit.ErrLeaseLost)):
			log.Info("order closer: stepped down", "key", LeaderKey.String(), "reason", err)
			leading = false
		case err != nil && !errors.Is(err, lockkit.ErrNotAcquired):
			log.Warn("order closer: round", "key", LeaderKey.String(), "err", err)
		}
		sleep(ctx, s.interval())
	}
}

// tryOnly makes a Locker's Acquire a TryAcquire: a closer round is not
// worth waiting for, the next one is an interval away.
type tryOnly struct{ lockkit.Locker }

func (t tryOnly) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return t.TryAcquire(ctx, key, opts...)
}

// CloseExpired runs one closer round: it cancels every order awaiting
// payment past the pay timeout, one order per transaction, and returns how
// many it cancelled. RunCloser calls it as the leader; tests call it to
// run a round now.
func (s *Service) CloseExpired(ctx context.Context, log *slog.Logger) (int, error) {
	closed := 0
	for {
		ids, err := s.store.Expired(ctx, now().Add(-s.o.PayTimeout), closeBatch)
		if err != nil {
			return closed, err
		}
		var errs []error
		for _, id := range ids {
			if ctx.Err() != nil {
				return closed, context.Cause(ctx)
			}
			ok, err := s.closeOne(ctx, id)
			if err != nil {
				errs = append(errs, err)
				log.Warn("order closer: cancel", "order", id, "err", err)
				continue
			}
			if ok {
				closed++
				log.Info("order closer: cancelled unpaid order", "order", id)
			}
		}
		// A full batch may have more behind it; a batch with failures is
		// retried next round, not at once.
		if len(ids) < closeBatch || len(errs) > 0 {
			return closed, errors.Join(errs...)
		}
	}
}

// sleep waits d or until ctx ends, and reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
