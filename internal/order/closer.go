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
// loop, only the holder of this key closes orders (a job that runs on
// exactly one node). With the none backend every instance holds it, and
// the audit shows what that costs.
var LeaderKey = lockkey.OrderCloser.Key()

// leaderWait bounds one wait for the leader lease. The wait wakes at once
// when the lease is freed (on backends that can wait without polling), so
// it does not slow a takeover; bounding it keeps a follower from holding a
// database wait open for ever (mysql-forupdate waits in a row lock) and
// lets it notice a closed context on every backend.
const leaderWait = 30 * time.Second

// closeBatch bounds the orders one round reads; the next round takes the
// rest.
const closeBatch = 100

// interval is the time between two closer rounds: a tenth of the pay
// timeout, so that an order is cancelled soon after its deadline, between
// 100 ms and 30 s.
func (s *Service) interval() time.Duration {
	return min(max(s.o.PayTimeout/10, 100*time.Millisecond), 30*time.Second)
}

// RunCloser runs the closer loop until ctx ends: wait for the leader lease,
// then close expired orders round after round while it holds it. The lease
// is renewed by the watchdog; when it is lost (the lock server says it is
// gone, or this process stalled past it), the round in progress stops at
// once (its context is cancelled) and the loop goes back to waiting. A
// change already inside its transaction finishes, and its fence decides
// whether it lands.
func (s *Service) RunCloser(ctx context.Context, log *slog.Logger) {
	for ctx.Err() == nil {
		err := lockkit.Do(ctx, s.o.Locker, LeaderKey.String(), func(ctx context.Context, fence uint64) error {
			log.Info("order closer: leading", "key", LeaderKey.String(), "fence", fence, "interval", s.interval())
			err := s.lead(ctx, log)
			log.Info("order closer: stepped down", "key", LeaderKey.String(), "fence", fence, "reason", context.Cause(ctx))
			return err
		}, lockkit.WithAutoRenew(s.o.LeaderTTL), lockkit.WithWaitTimeout(leaderWait))
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, lockkit.ErrNotAcquired):
			continue // another instance leads: wait again
		case err != nil && !errors.Is(err, lockkit.ErrLeaseLost):
			log.Warn("order closer: leader lease", "key", LeaderKey.String(), "err", err)
		}
		sleep(ctx, s.interval())
	}
}

// lead closes expired orders every interval until ctx ends.
func (s *Service) lead(ctx context.Context, log *slog.Logger) error {
	for {
		if _, err := s.CloseExpired(ctx, log); err != nil && ctx.Err() == nil {
			log.Warn("order closer: round", "err", err)
		}
		if !sleep(ctx, s.interval()) {
			return context.Cause(ctx)
		}
	}
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
