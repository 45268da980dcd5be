package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// drain waits until nothing is left in flight: no order left for the
// closer (its cancel is an event too), the outbox published (outbox
// delivery; a direct row's unpublished rows stay so), and the durable
// consumer with nothing pending or unacknowledged, twice in a row a
// second apart, so that a paused consumer that went on has committed its
// late effect too. It returns how long that took.
func (r *row) drain(ctx context.Context, db *sql.DB) (time.Duration, error) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	settled := 0
	for settled < 2 {
		idle, err := r.events.idle(ctx, db, r.spec.Delivery == report.DeliveryOutbox)
		switch {
		case err != nil && ctx.Err() != nil:
			return time.Since(began), fmt.Errorf("events not drained after %s: %w", time.Since(began).Round(time.Second), err)
		case idle:
			settled++
		default:
			settled = 0
		}
		sleepCtx(ctx, time.Second)
	}
	return time.Since(began) - time.Second, nil
}

// idle reports whether the outbox (when outbox says it is drained) and
// the consumer have nothing left.
func (rig *eventRig) idle(ctx context.Context, db *sql.DB, outbox bool) (bool, error) {
	query := `SELECT COUNT(*) FROM orders WHERE status = 'awaiting_payment'`
	if outbox {
		query += ` UNION ALL SELECT COUNT(*) FROM event_outbox WHERE published_at IS NULL`
	}
	left, err := column[int64](ctx, db, query)
	if err != nil {
		return false, err
	}
	if slices.ContainsFunc(left, func(n int64) bool { return n > 0 }) {
		return false, nil
	}
	info, err := rig.consumerInfo(ctx)
	if err != nil {
		return false, err
	}
	return info.NumPending == 0 && info.NumAckPending == 0, nil
}

// measureEvents compares, once drained, the outbox with the stream (events
// lost), the paid orders with their credits (doubled, missing) and the
// credits' times with their events' (lag).
func (r *row) measureEvents(ctx context.Context, db *sql.DB) (report.Events, error) {
	var e report.Events
	written, err := column[string](ctx, db, `SELECT event_id FROM event_outbox`)
	if err != nil {
		return e, err
	}
	inStream, err := r.events.streamIDs(ctx)
	if err != nil {
		return e, err
	}
	e.Written = int64(len(written))
	for _, id := range written {
		if !inStream[id] {
			e.Lost++
		}
	}
	if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM orders WHERE status = 'paid'`).Scan(&e.Paid); err != nil {
		return e, err
	}
	if err := db.QueryRowContext(ctx, doubledQuery).Scan(&e.Doubled); err != nil {
		return e, err
	}
	uncredited, err := column[int64](ctx, db, `SELECT o.id FROM orders o
		LEFT JOIN loyalty_entries c ON c.order_id = o.id WHERE o.status = 'paid' AND c.id IS NULL`)
	if err != nil {
		return e, err
	}
	for _, id := range uncredited {
		if inStream[events.ID(id, events.TypeOrderPaid)] {
			e.Missing++
		}
	}
	lags, err := column[float64](ctx, db, `SELECT TIMESTAMPDIFF(MICROSECOND, x.created_at, MIN(c.created_at)) / 1000
		FROM loyalty_entries c JOIN event_outbox x ON x.event_id = c.event_id GROUP BY c.event_id, x.created_at`)
	if err != nil {
		return e, err
	}
	e.Lag = percentiles(lags)
	if e.Redelivered, err = r.events.redeliveries(ctx); err != nil {
		return e, err
	}
	e.Republished = r.republished(ctx)
	return e, nil
}

// doubledQuery counts the credits beyond the first for one order.
const doubledQuery = `SELECT COALESCE(SUM(n - 1), 0) FROM
	(SELECT COUNT(*) AS n FROM loyalty_entries GROUP BY order_id) credits`

// column reads a one-column query.
func column[T any](ctx context.Context, db *sql.DB, query string) ([]T, error) {
	rows, err := db.QueryContext(ctx, query)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		var v T
		if err := rows.Scan(&v); err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// streamIDs are the event ids the stream holds, read message by message.
func (rig *eventRig) streamIDs(ctx context.Context) (map[string]bool, error) {
	stream, err := rig.js.Stream(ctx, events.Stream)
	if err != nil {
		return nil, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, err
	}
	ids := make(map[string]bool, info.State.Msgs)
	for seq := info.State.FirstSeq; info.State.Msgs > 0 && seq <= info.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			return nil, fmt.Errorf("stream message %d: %w", seq, err)
		}
		var ev struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			return nil, fmt.Errorf("stream message %d: %w", seq, err)
		}
		ids[ev.ID] = true
	}
	return ids, nil
}

// percentiles are the nearest-rank p50, p95, p99 and the max of values,
// in milliseconds.
func percentiles(values []float64) report.Latency {
	if len(values) == 0 {
		return report.Latency{}
	}
	v := slices.Clone(values)
	slices.Sort(v)
	rank := func(p float64) float64 { return v[max(0, int(math.Ceil(p*float64(len(v))))-1)] }
	return report.Latency{P50: rank(0.50), P95: rank(0.95), P99: rank(0.99), Max: v[len(v)-1], N: int64(len(v))}
}
