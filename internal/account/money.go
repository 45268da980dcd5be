package account

import (
	"context"
	"crypto/rand"
)

// KindTransfer is the ledger kind of both legs of a transfer.
const KindTransfer = "transfer"

// newTransferID names the legs a change of kind writes: a fresh id for a
// transfer, shared by its two legs; none for any other kind.
func newTransferID(kind string) string {
	if kind != KindTransfer {
		return ""
	}
	return rand.Text()
}

// legsWithoutID keys the transfer legs that carry no id: written before
// ids were, or by hand. They can only be summed together.
const legsWithoutID = "without_id"

// UnpairedTransfers is an audit check: per transfer whose legs do not sum
// to zero (a credit without its debit, or the reverse), that sum, keyed by
// the transfer's id. Every history's rows count: a transfer is paired
// whatever put replaced either account since. Each account agreeing with
// its own ledger does not show this; only the pairing does.
func (s *Store) UnpairedTransfers(ctx context.Context) (map[string]int64, error) {
	var rows []struct {
		TransferID string
		Sum        int64
	}
	err := s.db.WithContext(ctx).Raw(`
		SELECT transfer_id, SUM(amount) AS sum FROM ledger_entries
		WHERE kind = ? GROUP BY transfer_id HAVING SUM(amount) <> 0`, KindTransfer).Scan(&rows).Error
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		key := r.TransferID
		if key == "" {
			key = legsWithoutID
		}
		out[key] = r.Sum
	}
	return out, nil
}

// UnbalancedMoney is an audit check: the sum of every balance minus what
// the money that entered and left the accounts explains, that is the
// openings plus the deposits, withdrawals and payments of the current
// histories. Transfers move money between accounts and explain nothing,
// except a leg whose other leg lies in a history an admin put replaced
// since: for the current histories, that leg's money came from outside.
// Keyed "all"; read in one statement. A lost update shows here as well as
// in balance_drift; a transfer leg without its pair (laid down by hand,
// or a leg without an id) only here and in unpaired_transfer_cents.
func (s *Store) UnbalancedMoney(ctx context.Context) (map[string]int64, error) {
	var drift int64
	err := s.db.WithContext(ctx).Raw(`
		SELECT
		  (SELECT COALESCE(SUM(balance - opening), 0) FROM accounts)
		  - (SELECT COALESCE(SUM(l.amount), 0)
		     FROM ledger_entries l JOIN accounts a ON a.id = l.account_id AND a.history = l.history
		     WHERE l.kind <> ? OR (l.transfer_id <> '' AND NOT EXISTS (
		       SELECT 1 FROM ledger_entries m JOIN accounts ma ON ma.id = m.account_id AND ma.history = m.history
		       WHERE m.transfer_id = l.transfer_id AND m.id <> l.id)))
		AS drift`, KindTransfer).Scan(&drift).Error
	if err != nil {
		return nil, err
	}
	if drift == 0 {
		return map[string]int64{}, nil
	}
	return map[string]int64{"all": drift}, nil
}
