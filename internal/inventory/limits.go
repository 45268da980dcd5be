package inventory

import (
	"context"
	"strconv"
)

// limited is the audit's view of one user's units of one product with a
// per-user limit, in its current sale, read in one statement: what the
// purchase rows hold (reservations and sales less returns) and what the
// per-user total counted.
type limited struct {
	SKU          string
	UserID       int64
	PerUserLimit int64
	Bought       int64
	Counted      int64
}

func (l limited) key() string { return l.SKU + ":" + strconv.FormatInt(l.UserID, 10) }

func (s *Store) limited(ctx context.Context) ([]limited, error) {
	var rows []limited
	err := s.db.WithContext(ctx).Raw(`
		SELECT k.sku AS sku, k.user_id AS user_id, p.per_user_limit AS per_user_limit,
		  COALESCE((SELECT SUM(pu.quantity) FROM purchases pu
		            WHERE pu.sku = k.sku AND pu.user_id = k.user_id AND pu.sale = p.sale), 0) AS bought,
		  COALESCE((SELECT l.units FROM purchase_limits l
		            WHERE l.sku = k.sku AND l.user_id = k.user_id), 0) AS counted
		FROM (SELECT sku, user_id FROM purchases UNION SELECT sku, user_id FROM purchase_limits) k
		JOIN products p ON p.sku = k.sku
		WHERE p.per_user_limit > 0`).Scan(&rows).Error
	return rows, err
}

// OverLimit is the audit check of the per-user limit: per SKU and user
// ("<sku>:<user>"), the units the purchase rows of the current sale give
// the user beyond the product's limit.
func (s *Store) OverLimit(ctx context.Context) (map[string]int64, error) {
	rows, err := s.limited(ctx)
	out := map[string]int64{}
	for _, r := range rows {
		if over := r.Bought - r.PerUserLimit; over > 0 {
			out[r.key()] = over
		}
	}
	return out, err
}

// MiscountedLimit is the audit check of the per-user totals the limit is
// enforced on: per SKU and user, the total minus the units the purchase
// rows of the current sale hold. Negative means units the limit no longer
// sees, which the user may buy again.
func (s *Store) MiscountedLimit(ctx context.Context) (map[string]int64, error) {
	rows, err := s.limited(ctx)
	out := map[string]int64{}
	for _, r := range rows {
		if d := r.Counted - r.Bought; d != 0 {
			out[r.key()] = d
		}
	}
	return out, err
}
