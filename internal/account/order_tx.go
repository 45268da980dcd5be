package account

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/storage"
)

// KindOrder is the ledger kind of an order's payment.
const KindOrder = "order"

// Claim raises account id's fence to fence before the caller reads or
// writes it, as Update does for its own read-modify-write (storage.Fenced says
// why the claim comes first). A fence of 0 claims nothing. It returns
// ErrNotFound, or lockkit.ErrFenced when a newer token holds the row.
func (s *Store) Claim(ctx context.Context, id int64, fence uint64) error {
	return s.claim(ctx, []int64{id}, map[int64]uint64{id: fence})
}

// Debit takes amount cents from account id for order inside the caller's
// transaction tx, with its ledger row in the account's current history:
// both land or neither. The write is fenced (fence as claimed with Claim;
// 0 writes unfenced) and guarded by the balance itself, so that no debit
// ever overdraws, whatever decided it: the caller's lock makes the guard
// redundant, the guard makes a missing lock harmless here.
func Debit(tx *gorm.DB, id, amount int64, fence uint64, order int64) error {
	if amount <= 0 {
		return fmt.Errorf("%w: amount_cents must be a positive integer, got %d", ErrInvalidAmount, amount)
	}
	written, err := accounts.Update(tx, id, fence, storage.Change{
		Set:   "balance = balance - ?, version = version + 1, updated_at = ?",
		Guard: "balance >= ?",
		Args:  []any{amount, time.Now().UTC(), amount},
	})
	if err != nil {
		return err
	}
	if !written {
		var a Account
		err := tx.Take(&a, id).Error
		switch {
		case errors.Is(err, gorm.ErrRecordNotFound):
			return fmt.Errorf("%w: no account %d", ErrNotFound, id)
		case err != nil:
			return err
		case fence != 0 && a.Fence != fence:
			return accounts.Refused(id, fence)
		}
		return fmt.Errorf("%w: balance is %d cents, the order costs %d", ErrInsufficientFunds, a.Balance, amount)
	}
	return insertInHistory(tx, &LedgerEntry{AccountID: id, Amount: -amount, Kind: KindOrder, Fence: fence, OrderID: order})
}

// OrderDebits are the ledger rows of one order, for the order audit.
type OrderDebits struct {
	Rows  int64
	Cents int64 // the sum of their amounts: negative for a debit
	// MinAccount and MaxAccount bound the accounts the rows moved: both
	// the order's user when every row is its.
	MinAccount, MaxAccount int64
}

// OrderLedger returns the order rows of the ledger by order id, whatever
// their history (an order paid before an admin put stays paid), read with
// tx so that the caller can read them in the same snapshot as the orders.
func OrderLedger(tx *gorm.DB) (map[int64]OrderDebits, error) {
	var rows []struct {
		OrderID        int64
		N              int64
		Cents          int64
		MinAcc, MaxAcc int64
	}
	err := tx.Raw(`SELECT order_id, COUNT(*) AS n, COALESCE(SUM(amount), 0) AS cents,
		MIN(account_id) AS min_acc, MAX(account_id) AS max_acc
		FROM ledger_entries WHERE order_id <> 0 GROUP BY order_id`).Scan(&rows).Error
	out := make(map[int64]OrderDebits, len(rows))
	for _, r := range rows {
		out[r.OrderID] = OrderDebits{Rows: r.N, Cents: r.Cents, MinAccount: r.MinAcc, MaxAccount: r.MaxAcc}
	}
	return out, err
}
