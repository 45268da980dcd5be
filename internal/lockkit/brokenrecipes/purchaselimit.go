package brokenrecipes

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// ErrLimitExceeded: the purchase would take the user past the limit.
var ErrLimitExceeded = errors.New("purchase limit exceeded")

// purchasesTable is CountThenInsert's insert-only record: one row per sale.
const purchasesTable = `CREATE TABLE IF NOT EXISTS brokenrecipes_purchases (
  id       BIGINT AUTO_INCREMENT PRIMARY KEY,
  user_id  BIGINT      NOT NULL,
  sku      VARCHAR(64) NOT NULL,
  quantity BIGINT      NOT NULL,
  KEY (user_id, sku)
) ENGINE = InnoDB`

// UNSAFE: CountThenInsert is a per-user purchase limit as the source's
// code reads without the lock around it: in one transaction, add up the
// user's purchases of the SKU, and if this one keeps the total within the
// limit, insert it. The count is a plain read, which nothing stops another
// purchase of the same user from making too: two purchases that both count
// before either inserts both pass, and the user buys more than the limit.
// shop's sale checks and adds in one conditional UPDATE of a per-(user,
// SKU) total, in the sale's transaction (inventory's countLimit), which
// the row lock of the UPDATE serializes.
type CountThenInsert struct {
	db *sql.DB
	// afterCount, if set, runs once the count has allowed the purchase and
	// before the insert: the tests let every buyer count there first.
	afterCount func()
}

// UNSAFE: NewCountThenInsert returns the count-then-insert limit over db
// (MySQL or MariaDB), creating its table brokenrecipes_purchases if it is
// missing.
func NewCountThenInsert(ctx context.Context, db *sql.DB) (*CountThenInsert, error) {
	if _, err := db.ExecContext(ctx, purchasesTable); err != nil {
		return nil, fmt.Errorf("brokenrecipes: create purchases table: %w", err)
	}
	return &CountThenInsert{db: db}, nil
}

// UNSAFE: Buy records a purchase of quantity units of sku by user if the
// user's units of sku stay within limit; ErrLimitExceeded if not.
func (c *CountThenInsert) Buy(ctx context.Context, user int64, sku string, quantity, limit int64) error {
	tx, err := c.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var bought int64
	err = tx.QueryRowContext(ctx, "SELECT COALESCE(SUM(quantity), 0) FROM brokenrecipes_purchases WHERE user_id = ? AND sku = ?",
		user, sku).Scan(&bought)
	if err != nil {
		return err
	}
	if bought+quantity > limit {
		return fmt.Errorf("%w: %d bought, %d asked, at most %d", ErrLimitExceeded, bought, quantity, limit)
	}
	// The flaw: the total counted may already be out of date.
	if c.afterCount != nil {
		c.afterCount()
	}
	if _, err := tx.ExecContext(ctx, "INSERT INTO brokenrecipes_purchases (user_id, sku, quantity) VALUES (?, ?, ?)",
		user, sku, quantity); err != nil {
		return err
	}
	return tx.Commit()
}
