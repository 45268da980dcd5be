package account

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/optimistic"
	"github.com/lockbench/shop/internal/storage"
)

// writeTimeout bounds the write transaction, which runs detached from the
// request's cancellation (see Update).
const writeTimeout = 5 * time.Second

// Store keeps accounts and their ledger in SQL.
type Store struct {
	db *gorm.DB
	// beforeWrite, when set by a test, runs between the decision and the
	// write: the window a paused process sits in when its lease runs out.
	beforeWrite func(ctx context.Context)
}

// NewStore returns a Store on db. Migrate must have run.
func NewStore(db *gorm.DB) *Store { return &Store{db: db} }

// Models are the tables of this package, for migrations.
func Models() []any { return []any{&Account{}, &LedgerEntry{}} }

// Get reads one account.
func (s *Store) Get(ctx context.Context, id int64) (Account, error) {
	var a Account
	err := s.db.WithContext(ctx).Take(&a, id).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Account{}, fmt.Errorf("%w: no account %d", ErrNotFound, id)
	}
	return a, err
}

// Update is the read-modify-write of the accounts ids (in that order in
// accts). It claims the rows with their fences, reads them, lets fn change
// their balances, then writes every change with its ledger row in one
// transaction. A fence of 0 (a backend that cannot fence, or none) skips
// the claim and writes unfenced, leaving the row's fence as it was.
//
// With a fence, the write lands only if no newer token has claimed the row
// since this Update claimed it; otherwise nothing is written and Update
// returns lockkit.ErrFenced (also when a newer token had claimed it before:
// then nothing is read). storage.Fenced says why the claim comes before
// the read.
//
// The claim is its own autocommit statement and the read is a plain
// SELECT, neither in the write's transaction nor FOR UPDATE: no row lock is
// held while fn runs. The caller's lock is what serializes the
// read-modify-write, and the fence is what catches a caller whose lock ran
// out. A row lock here would hide the difference between a good lock and
// none at all.
func (s *Store) Update(ctx context.Context, kind string, ids []int64, fences map[int64]uint64,
	fn func(ctx context.Context, accts []*Account) error) error {
	if err := s.claim(ctx, ids, fences); err != nil {
		return err
	}
	accts := make([]*Account, len(ids))
	before := make(map[int64]int64, len(ids))
	for i, id := range ids {
		a, err := s.Get(ctx, id)
		if err != nil {
			return err
		}
		accts[i] = &a
		before[id] = a.Balance
	}
	if err := fn(ctx, accts); err != nil {
		return err
	}
	// Last chance to stop cheaply: the lease was lost or the client left.
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if s.beforeWrite != nil {
		s.beforeWrite(ctx)
	}
	// From here the write runs to its end even if the request is cancelled
	// or the lease is lost meanwhile: a transaction cut half-way leaves the
	// client unsure whether it committed, and the fence, checked inside the
	// transaction, is what decides whether a late write may land.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	// Rows in id order, so that two unlocked transfers in opposite
	// directions (the none baseline) cannot deadlock in the database.
	order := slices.Clone(accts)
	slices.SortFunc(order, func(a, b *Account) int { return compare(a.ID, b.ID) })
	transfer := newTransferID(kind)
	return s.db.WithContext(wctx).Transaction(func(tx *gorm.DB) error {
		for _, a := range order {
			delta := a.Balance - before[a.ID]
			if delta == 0 {
				continue
			}
			if err := writeBalance(tx, a, fences[a.ID]); err != nil {
				return err
			}
			entry := LedgerEntry{AccountID: a.ID, Amount: delta, Kind: kind, Fence: fences[a.ID], TransferID: transfer}
			if err := insertInHistory(tx, &entry); err != nil {
				return err
			}
		}
		return keyed.Save(ctx, tx)
	})
}

// accounts are the fenced rows of this store (storage.Fenced says how a
// claim and a fenced write keep a stale holder out).
var accounts = storage.Fenced{Table: "accounts", Key: "id", Noun: "account", NotFound: ErrNotFound}

// claim claims each fenced row, in id order, before Update reads the rows.
// A token claims a row at most once, so a repeated Update under the same
// grant is refused instead of applied twice.
func (s *Store) claim(ctx context.Context, ids []int64, fences map[int64]uint64) error {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	for _, id := range slices.Compact(sorted) {
		if err := accounts.Claim(ctx, s.db, id, fences[id]); err != nil {
			return err
		}
	}
	return nil
}

// writeBalance is the fenced write: it lands only while the row's fence is
// still the token Update claimed it with (fence = token, not <: the claim
// has raised it already), that is, while no newer holder has claimed the
// row since this one read it, and while its version is the one read: an
// optimistic writer takes no lock (a rolling switch of
// SHOP_BALANCE_STRATEGY runs both) and must not be overwritten either.
// Unfenced (fence 0) it checks nothing, which is what lets the none
// baseline lose updates; it still bumps the version for optimistic
// writers to see. A pinned change (one with an If-Match) checks the
// version whatever the fence: the client's precondition holds even where
// the lock does not.
func writeBalance(tx *gorm.DB, a *Account, fence uint64) error {
	c := storage.Change{Set: "balance = ?, version = version + 1, updated_at = ?", Args: []any{a.Balance, time.Now().UTC()}}
	if fence != 0 || a.pinned {
		c.Guard, c.Args = "version = ?", append(c.Args, a.Version)
	}
	written, err := accounts.Update(tx, a.ID, fence, c)
	if err != nil {
		return err
	}
	if !written {
		var cur Account
		err := tx.Take(&cur, a.ID).Error
		switch {
		case errors.Is(err, gorm.ErrRecordNotFound):
			return fmt.Errorf("%w: account %d was deleted while in use", ErrNotFound, a.ID)
		case err != nil:
			return err
		case fence != 0 && cur.Fence != fence:
			return accounts.Refused(a.ID, fence)
		case a.pinned:
			return fmt.Errorf("%w: account %d moved from ETag %s to %s while this change was written",
				ErrPreconditionFailed, a.ID, ETag(a.Version), ETag(cur.Version))
		}
		return fmt.Errorf("%w: account %d was written outside lock %d", optimistic.ErrConflict, a.ID, fence)
	}
	return nil
}

func compare(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// insertInHistory inserts e as a row of its account's current history.
// Call it after the transaction tx wrote the account's row: the write holds
// the row until commit, so no admin put can start a new history in
// between, and the row lands in the history whose balance it moved. The
// history is read by the INSERT itself, in a subquery, so that no flow
// pays a round trip for it: inside a critical section every round trip is
// paid by each writer queued behind it. It is still gorm's Create, so the
// slow-query log and the tests' create hooks see the row.
func insertInHistory(tx *gorm.DB, e *LedgerEntry) error {
	if e.CreatedAt.IsZero() {
		e.CreatedAt = tx.NowFunc()
	}
	return tx.Model(&LedgerEntry{}).Create(map[string]any{
		"account_id": e.AccountID, "amount": e.Amount, "kind": e.Kind, "fence": e.Fence,
		"created_at": e.CreatedAt, "order_id": e.OrderID, "transfer_id": e.TransferID,
		"history": gorm.Expr("(SELECT history FROM accounts WHERE id = ?)", e.AccountID),
	}).Error
}

// Put creates account id with an opening balance, or replaces an existing
// one's balance and opening. Replacing starts a new history: the ledger
// rows stay, as the old history's (the orders they paid still reconcile
// against them), but no longer count in the balance audit. The upsert
// raises the row's version, so that a holder that read the balance before
// the put (under a lock or optimistically) is refused when it writes
// (optimistic.ErrConflict: its write checks the version it read). The
// fence is kept, not raised: a backend whose tokens count by one would
// otherwise see its next grant refused. It reports whether the account
// was created.
func (s *Store) Put(ctx context.Context, id, balance int64) (created bool, err error) {
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// One statement tells a replacement and starts its history (two
		// puts at once start two).
		res := tx.Exec("UPDATE accounts SET history = history + 1 WHERE id = ?", id)
		if res.Error != nil {
			return res.Error
		}
		created = res.RowsAffected == 0
		return upsert(tx, []Account{{ID: id, Balance: balance, Opening: balance}})
	})
	return created, err
}

// upsert creates accts or replaces their balances. A replaced row's
// version moves as with any other write of its balance: it is the
// account's ETag, and a reader of the old balance must not write over the
// new one.
func upsert(tx *gorm.DB, accts []Account) error {
	updates := append(clause.AssignmentColumns([]string{"balance", "opening", "updated_at"}),
		clause.Assignment{Column: clause.Column{Name: "version"}, Value: gorm.Expr("version + 1")})
	return tx.Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "id"}},
		DoUpdates: updates,
	}).CreateInBatches(&accts, 500).Error
}

// fixtures are the accounts of each named fixture (see docs/api.md).
var fixtures = map[string]func() []Account{
	// Ten users with 1,000.00 each: enough to try every route by hand.
	"default": func() []Account { return numbered(10, 100_000) },
	// A thousand users with 10,000.00 each, for k6.
	"loadtest": func() []Account { return numbered(1000, 1_000_000) },
}

func numbered(n int, balance int64) []Account {
	out := make([]Account, n)
	for i := range out {
		out[i] = Account{ID: int64(i + 1), Balance: balance, Opening: balance}
	}
	return out
}

// Reset replaces every account and the whole ledger, every history's, with
// the fixture's accounts. Fences of accounts that stay are kept; their
// history is raised, and upsert raises their version, in the same
// transaction, as Put does: a
// holder that claimed and read an account before the reset is refused when
// it writes (optimistic.ErrConflict), whatever its token.
func (s *Store) Reset(ctx context.Context, fixture string) error {
	build, ok := fixtures[fixture]
	if !ok {
		return fmt.Errorf("account: no fixture %q", fixture)
	}
	accts := build()
	ids := make([]int64, len(accts))
	for i, a := range accts {
		ids[i] = a.ID
	}
	return storage.Conn(ctx, s.db).Transaction(func(tx *gorm.DB) error {
		if err := tx.Where("1 = 1").Delete(&LedgerEntry{}).Error; err != nil {
			return err
		}
		if err := tx.Where("id NOT IN ?", ids).Delete(&Account{}).Error; err != nil {
			return err
		}
		if err := tx.Exec("UPDATE accounts SET history = history + 1").Error; err != nil {
			return err
		}
		return upsert(tx, accts)
	})
}

// Drift is the audit check: per account, balance - (opening + sum of the
// ledger rows of its current history), read in one statement so that a
// change is seen whole or not at all (the balance and its ledger row
// commit together).
func (s *Store) Drift(ctx context.Context) (map[string]int64, error) {
	var rows []struct {
		ID    int64
		Drift int64
	}
	err := s.db.WithContext(ctx).Raw(`
		SELECT a.id AS id, a.balance - a.opening - COALESCE(SUM(l.amount), 0) AS drift
		FROM accounts a LEFT JOIN ledger_entries l ON l.account_id = a.id AND l.history = a.history
		GROUP BY a.id, a.balance, a.opening
		HAVING a.balance - a.opening - COALESCE(SUM(l.amount), 0) <> 0`).Scan(&rows).Error
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[strconv.FormatInt(r.ID, 10)] = r.Drift
	}
	return out, nil
}
