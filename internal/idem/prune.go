package idem

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/storage"
)

// PrunerKey is the pruner's leader lease: every instance runs the pruner
// loop, only the holder of this key runs a round, as the order closer does.
var PrunerKey = lockkey.IdemPruner.Key()

// pruneBatch bounds the rows one statement deletes. Each batch commits on
// its own, so that a prune never holds a long transaction (nor, on
// InnoDB, the gap locks of a large range) against the inserts of keyed
// changes.
const pruneBatch = 500

// pruneInterval is the time between two pruner rounds: a tenth of the
// TTL, between 1 s and 10 min. A record lives at most that much past its
// TTL.
func (m *Idem) pruneInterval() time.Duration {
	return min(max(m.o.TTL/10, time.Second), 10*time.Minute)
}

// RegisterMetrics registers shop_idem_records_pruned_total with reg.
func (m *Idem) RegisterMetrics(reg prometheus.Registerer) { reg.MustRegister(m.pruned) }

func newPrunedCounter() prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{
		Name: "shop_idem_records_pruned_total",
		Help: "Idempotency records deleted from the database because they outlived SHOP_IDEM_TTL.",
	})
}

// Prune deletes the records older than the TTL, in batches of pruneBatch
// rows, and returns how many it deleted. By then Redis has forgotten the
// key too, so a retry runs again (a client's key) or gets 422
// idempotency-key-unknown (a token), as docs/api.md says. RunPruner calls
// it as the leader; tests call it to run a round now.
func (m *Idem) Prune(ctx context.Context) (int64, error) {
	if m.o.DB == nil {
		return 0, nil
	}
	// Records are stamped with this clock too (gorm's CreatedAt), so the
	// comparison needs no time zone of its own.
	cutoff := time.Now().Add(-m.o.TTL)
	var pruned int64
	for ctx.Err() == nil {
		var rows []keyed.Record
		err := m.o.DB.WithContext(ctx).Select("user_id", "key_hash").Where("created_at < ?", cutoff).
			Order("created_at").Limit(pruneBatch).Find(&rows).Error
		if err != nil || len(rows) == 0 {
			return pruned, err
		}
		keys := make([][]any, len(rows))
		for i, r := range rows {
			keys[i] = []any{r.UserID, r.KeyHash}
		}
		// Selected first, then deleted by key: MariaDB allows no LIMIT in
		// an IN subquery, and SQLite no LIMIT on DELETE.
		res := m.o.DB.WithContext(ctx).Where("(user_id, key_hash) IN ? AND created_at < ?", keys, cutoff).Delete(&keyed.Record{})
		if res.Error != nil {
			return pruned, fmt.Errorf("idem: prune records: %w", res.Error)
		}
		pruned += res.RowsAffected
		m.pruned.Add(float64(res.RowsAffected))
		if len(rows) < pruneBatch {
			return pruned, nil
		}
	}
	return pruned, context.Cause(ctx)
}

// Reset deletes every record: an admin reset empties the tables whose
// changes they prove. The answers Redis keeps expire with their keys.
func (m *Idem) Reset(ctx context.Context, _ string) error {
	if m.o.DB == nil {
		return nil
	}
	return storage.Conn(ctx, m.o.DB).Where("1 = 1").Delete(&keyed.Record{}).Error
}

// RunPruner runs the pruner loop until ctx ends: every interval it tries
// the leader lease from leader and, if it gets it, runs one round and lets
// it go, renewing it every leaderTTL/3 while the round lasts (zero is
// lockkit.DefaultLeaseTTL). The shape is
// the order closer's (order.Service.RunCloser), for the same reasons.
func (m *Idem) RunPruner(ctx context.Context, leader lockkit.Locker, leaderTTL time.Duration, log *slog.Logger) {
	if leaderTTL <= 0 {
		leaderTTL = lockkit.DefaultLeaseTTL
	}
	leading := false
	for ctx.Err() == nil {
		err := lockkit.Do(ctx, tryOnly{leader}, PrunerKey.String(), func(ctx context.Context, fence uint64) error {
			if !leading {
				log.Info("idem pruner: leading", "key", PrunerKey.String(), "fence", fence, "interval", m.pruneInterval())
				leading = true
			}
			n, err := m.Prune(ctx)
			if n > 0 {
				log.Info("idem pruner: deleted expired records", "rows", n)
			}
			if ctx.Err() != nil {
				return context.Cause(ctx) // lease lost: the caller steps down
			}
			return err
		}, lockkit.WithAutoRenew(leaderTTL))
		if ctx.Err() != nil {
			return
		}
		switch {
		case leading && (errors.Is(err, lockkit.ErrNotAcquired) || errors.Is(err, lockkit.ErrLeaseLost)):
			log.Info("idem pruner: stepped down", "key", PrunerKey.String(), "reason", err)
			leading = false
		case err != nil && !errors.Is(err, lockkit.ErrNotAcquired):
			log.Warn("idem pruner: round", "key", PrunerKey.String(), "err", err)
		}
		t := time.NewTimer(m.pruneInterval())
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

// tryOnly makes a Locker's Acquire a TryAcquire: a round is not worth
// waiting for, the next one is an interval away.
type tryOnly struct{ lockkit.Locker }

func (t tryOnly) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return t.TryAcquire(ctx, key, opts...)
}
