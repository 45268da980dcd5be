package account

import (
	"context"
	"fmt"
	"slices"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/optimistic"
)

// UpdateVersioned is Update without a lock: it reads the accounts ids with
// their versions, lets fn change their balances, and writes every change
// with its ledger row in one transaction, each row only over the version
// and balance it read. optimistic.ErrMoved when any row changed since:
// nothing is written.
//
// The WHERE checks the balance read as well as the version: a writer that
// does not bump the version (a tool, an older binary during a rolling
// deploy) still cannot have its change overwritten.
func (s *Store) UpdateVersioned(ctx context.Context, kind string, ids []int64, fn func(ctx context.Context, accts []*Account) error) error {
	accts := make([]*Account, len(ids))
	read := make(map[int64]Account, len(ids))
	for i, id := range ids {
		a, err := s.Get(ctx, id)
		if err != nil {
			return err
		}
		accts[i] = &a
		read[id] = a
	}
	if err := fn(ctx, accts); err != nil {
		return err
	}
	if s.beforeWrite != nil {
		s.beforeWrite(ctx)
	}
	// Rows in id order, so that two transfers in opposite directions
	// cannot deadlock in the database.
	order := slices.Clone(accts)
	slices.SortFunc(order, func(a, b *Account) int { return compare(a.ID, b.ID) })
	// Detached from the request, as Update's write is: a transaction cut
	// half-way would leave its outcome unknown to the client.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	transfer := newTransferID(kind)
	return s.db.WithContext(wctx).Transaction(func(tx *gorm.DB) error {
		for _, a := range order {
			was := read[a.ID]
			delta := a.Balance - was.Balance
			if delta == 0 {
				continue
			}
			res := tx.Exec("UPDATE accounts SET balance = ?, version = version + 1, updated_at = ? WHERE id = ? AND version = ? AND balance = ?",
				a.Balance, time.Now().UTC(), a.ID, was.Version, was.Balance)
			if res.Error != nil {
				return res.Error
			}
			if res.RowsAffected == 0 {
				return fmt.Errorf("%w: account %d", optimistic.ErrMoved, a.ID)
			}
			if err := insertInHistory(tx, &LedgerEntry{AccountID: a.ID, Amount: delta, Kind: kind, TransferID: transfer}); err != nil {
				return err
			}
		}
		return keyed.Save(ctx, tx)
	})
}
