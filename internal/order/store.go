package order

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"gorm.io/gorm"
)

// Store keeps orders in SQL.
type Store struct{ db *gorm.DB }

// NewStore returns a Store on db, which must translate driver errors
// (gorm.Config.TranslateError, as storage.Open sets it) so that a
// duplicate key reads as gorm.ErrDuplicatedKey. Migrate must have run.
func NewStore(db *gorm.DB) *Store { return &Store{db: db} }

// Models are the tables of this package, for migrations.
func Models() []any { return []any{&Order{}} }

// CreatePending inserts o, which gets its id. If an order with o's user and
// key exists, nothing is inserted and that order is returned.
func (s *Store) CreatePending(ctx context.Context, o *Order) (existing *Order, err error) {
	err = s.db.WithContext(ctx).Create(o).Error
	if !errors.Is(err, gorm.ErrDuplicatedKey) {
		return nil, err
	}
	var found Order
	err = s.db.WithContext(ctx).Where("user_id = ? AND idempotency_key = ?", o.UserID, o.IdempotencyKey).Take(&found).Error
	if err != nil {
		return nil, fmt.Errorf("order: read the order of a used key: %w", err)
	}
	return &found, nil
}

// SetStatus moves a pending order to status. An order that is no longer
// pending is left alone: the first outcome recorded stays.
func (s *Store) SetStatus(ctx context.Context, id int64, status string, purchase int64) error {
	return s.db.WithContext(ctx).Model(&Order{}).Where("id = ? AND status = ?", id, StatusPending).
		Updates(map[string]any{"status": status, "purchase_id": purchase}).Error
}

// Delete removes a pending order that placed nothing.
func (s *Store) Delete(ctx context.Context, id int64) error {
	return s.db.WithContext(ctx).Where("id = ? AND status = ?", id, StatusPending).Delete(&Order{}).Error
}

// Get reads one order.
func (s *Store) Get(ctx context.Context, id int64) (Order, error) {
	var o Order
	err := s.db.WithContext(ctx).Take(&o, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Order{}, fmt.Errorf("%w: no order %d", ErrNotFound, id)
	}
	return o, err
}

// Duplicates is the audit check: for each idempotency key with more than one
// order, the orders beyond the first, keyed "<user>:<key>". The unique index
// makes it 0 by construction; the check is what proves the index is there
// and that nothing got around it.
func (s *Store) Duplicates(ctx context.Context) (map[string]int64, error) {
	var rows []struct {
		UserID         int64
		IdempotencyKey string
		N              int64
	}
	err := s.db.WithContext(ctx).Raw(`
		SELECT user_id, idempotency_key, COUNT(*) AS n FROM orders
		GROUP BY user_id, idempotency_key HAVING COUNT(*) > 1`).Scan(&rows).Error
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[strconv.FormatInt(r.UserID, 10)+":"+r.IdempotencyKey] = r.N - 1
	}
	return out, nil
}

// Reset deletes every order: no fixture has any. It implements the order
// half of audit.Resetter.
func (s *Store) Reset(ctx context.Context, _ string) error {
	return s.db.WithContext(ctx).Where("1 = 1").Delete(&Order{}).Error
}
