// Package account keeps users' balances: deposits, withdrawals and transfers
// computed in Go as read-modify-write (that is the point: it is the shape
// that loses updates without a lock) under lock:account:<id>, with each
// write fenced in the store and paired with an insert-only ledger row.
//
// The business rules are written once. Every change is a read-modify-write
// of the store (Store.Update), and only how that update is guarded differs
// by strategy: under the accounts' locks with their fences handed to the
// store (package guard; the unsafe baseline is the same over
// lockkit.None), or versioned and retried without a lock (optimistic.go).
package account

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/optimistic"
)

// Errors of the account domain. Handlers map them to statuses in http.go.
var (
	// ErrNotFound: no account has this id.
	ErrNotFound = errors.New("account not found")
	// ErrInsufficientFunds: a withdrawal or transfer exceeds the balance.
	ErrInsufficientFunds = errors.New("insufficient funds")
	// ErrOverflow: the balance would exceed the largest int64 cents.
	ErrOverflow = errors.New("balance would overflow")
	// ErrInvalidAmount: an amount is zero or negative.
	ErrInvalidAmount = errors.New("invalid amount")
	// ErrSameAccount: a transfer from an account to itself.
	ErrSameAccount = errors.New("transfer to the same account")
	// ErrPreconditionFailed: the account is not at a version the change's
	// Precondition names (If-Match); nothing was written.
	ErrPreconditionFailed = errors.New("precondition failed")
)

// Account is one balance, in integer cents.
type Account struct {
	ID      int64 `gorm:"primaryKey;autoIncrement:false" json:"id"`
	Balance int64 `gorm:"not null" json:"balance_cents"`
	// Opening is the balance the account was created with; the audit
	// checks Balance == Opening + the sum of the ledger.
	Opening int64 `gorm:"not null" json:"-"`
	// Fence is the highest fencing token that claimed this row; only its
	// holder may write the balance.
	Fence uint64 `gorm:"not null;default:0" json:"-"`
	// Version is bumped by every write of Balance; the optimistic strategy
	// writes only over the version it read (optimistic.go).
	Version uint64 `gorm:"not null;default:0" json:"-"`
	// History counts the admin puts that replaced the account: each starts
	// a new history, and a ledger row belongs to the history it was
	// written in.
	History   int64     `gorm:"not null;default:0" json:"-"`
	UpdatedAt time.Time `json:"-"`
	// pinned makes the write of a change that carried a Precondition land
	// only over the Version read, under every strategy.
	pinned bool
}

// LedgerEntry is one balance change, never updated or deleted (except by an
// admin reset, which deletes everything).
type LedgerEntry struct {
	ID        int64  `gorm:"primaryKey"`
	AccountID int64  `gorm:"not null;index"`
	Amount    int64  `gorm:"not null"` // signed: credit > 0, debit < 0
	Kind      string `gorm:"size:16;not null"`
	Fence     uint64 `gorm:"not null;default:0"`
	CreatedAt time.Time
	// OrderID is the order a debit pays (kind "order"); 0 for every other
	// change. The order audit reconciles orders with these rows.
	OrderID int64 `gorm:"not null;default:0;index"`
	// History is the account's history when the row was written: the
	// balance audit counts the current history's rows only, the order
	// audit all.
	History int64 `gorm:"not null;default:0"`
	// TransferID is shared by the two legs of one transfer (kind
	// "transfer"), so that the audit can pair them; empty otherwise.
	TransferID string `gorm:"size:32;not null;default:'';index"`
}

// Transfer is the result of a transfer, as the sender sees it: the
// recipient's balance is not the sender's business.
type Transfer struct {
	From        int64 `json:"from"`
	To          int64 `json:"to"`
	Amount      int64 `json:"amount_cents"`
	FromBalance int64 `json:"from_balance_cents"`
}

// Service is the account domain, as handlers and other domains see it.
type Service interface {
	Get(ctx context.Context, id int64) (Account, error)
	// Deposit and Withdraw write only while pre holds (the zero
	// Precondition always does).
	Deposit(ctx context.Context, id, amount int64, pre Precondition) (Account, error)
	Withdraw(ctx context.Context, id, amount int64, pre Precondition) (Account, error)
	Transfer(ctx context.Context, from, to, amount int64) (Transfer, error)
}

// Key is the lock key of account id.
func Key(id int64) lockkey.Key { return lockkey.Account.Key(strconv.FormatInt(id, 10)) }

// Options configure NewService.
type Options struct {
	// Locking guards each change under the lock strategy; its
	// CriticalSectionDelay is spent by both strategies.
	guard.Locking
	// Strategy is StrategyLock (default) or StrategyOptimistic.
	Strategy string
	// Retry bounds and counts the optimistic strategy's attempts.
	Retry optimistic.Retry
}

// Balance strategies.
const (
	// StrategyLock: read-modify-write under lock:account:<id>, fenced.
	StrategyLock = "lock"
	// StrategyOptimistic: no lock; each write lands only over the version
	// it read, and a loser reads again (optimistic.go).
	StrategyOptimistic = "optimistic"
)

// NewService returns the account service writing through store: under
// lock:account:<id> with fenced writes, or, with StrategyOptimistic,
// versioned writes retried without a lock.
func NewService(store *Store, o Options) Service {
	s := &service{store: store, delay: o.CriticalSectionDelay}
	if o.Strategy == StrategyOptimistic {
		s.optimistic = &o.Retry
	} else {
		s.guard = guard.New(lockkey.Account, o.Locking)
	}
	return s
}

// service is the business rules. Exactly one of guard and optimistic is
// set: how update keeps a read-modify-write whole.
type service struct {
	store      *Store
	delay      time.Duration
	guard      *guard.Guard
	optimistic *optimistic.Retry
}

// update is the read-modify-write of ids: under their locks, fenced, or
// versioned and retried when the strategy is optimistic.
func (s *service) update(ctx context.Context, kind string, ids []int64, fn func(ctx context.Context, accts []*Account) error) error {
	if s.optimistic != nil {
		return s.optimistic.Do(ctx, "balance", func(ctx context.Context) error {
			return s.store.UpdateVersioned(ctx, kind, ids, fn)
		})
	}
	// Unknown accounts are turned away before they name a lock: a backend
	// keeps a fence counter for every key ever locked, and a transfer's
	// recipient is any number the client likes.
	keys := make([]lockkey.Key, len(ids))
	for i, id := range ids {
		if _, err := s.store.Get(ctx, id); err != nil {
			return err
		}
		keys[i] = Key(id)
	}
	// Transfers lock both accounts; the guard takes them in sorted order,
	// so two transfers in opposite directions never wait in a cycle.
	return s.guard.Do(ctx, keys, func(ctx context.Context, f guard.Fences) error {
		fences := make(map[int64]uint64, len(ids))
		for i, id := range ids {
			fences[id] = f.Of(keys[i])
		}
		return s.store.Update(ctx, kind, ids, fences, fn)
	})
}

func (s *service) Get(ctx context.Context, id int64) (Account, error) { return s.store.Get(ctx, id) }

func (s *service) Deposit(ctx context.Context, id, amount int64, pre Precondition) (Account, error) {
	if amount <= 0 {
		return Account{}, fmt.Errorf("%w: amount_cents must be a positive integer, got %d", ErrInvalidAmount, amount)
	}
	var out Account
	keyed.Result(ctx, &out)
	err := s.update(ctx, "deposit", []int64{id}, func(ctx context.Context, accts []*Account) error {
		a := accts[0]
		if err := pre.apply(a); err != nil {
			return err
		}
		if a.Balance > math.MaxInt64-amount {
			return fmt.Errorf("%w: balance %d + %d cents exceeds %d", ErrOverflow, a.Balance, amount, int64(math.MaxInt64))
		}
		a.Balance += amount
		out = *a
		return guard.Work(ctx, s.delay)
	})
	return out, err
}

func (s *service) Withdraw(ctx context.Context, id, amount int64, pre Precondition) (Account, error) {
	if amount <= 0 {
		return Account{}, fmt.Errorf("%w: amount_cents must be a positive integer, got %d", ErrInvalidAmount, amount)
	}
	var out Account
	keyed.Result(ctx, &out)
	err := s.update(ctx, "withdraw", []int64{id}, func(ctx context.Context, accts []*Account) error {
		a := accts[0]
		if err := pre.apply(a); err != nil {
			return err
		}
		if a.Balance < amount {
			return fmt.Errorf("%w: balance is %d cents, withdrawal asks %d", ErrInsufficientFunds, a.Balance, amount)
		}
		a.Balance -= amount
		out = *a
		return guard.Work(ctx, s.delay)
	})
	return out, err
}

func (s *service) Transfer(ctx context.Context, from, to, amount int64) (Transfer, error) {
	if amount <= 0 {
		return Transfer{}, fmt.Errorf("%w: amount_cents must be a positive integer, got %d", ErrInvalidAmount, amount)
	}
	if from == to {
		return Transfer{}, fmt.Errorf("%w: from and to are both %d", ErrSameAccount, from)
	}
	if err := refuseUnaffordable(ctx, s.store, from, amount); err != nil {
		return Transfer{}, err
	}
	out := Transfer{From: from, To: to, Amount: amount}
	keyed.Result(ctx, &out)
	err := s.update(ctx, KindTransfer, []int64{from, to}, func(ctx context.Context, accts []*Account) error {
		src, dst := accts[0], accts[1]
		if src.Balance < amount {
			return fmt.Errorf("%w: balance is %d cents, transfer asks %d", ErrInsufficientFunds, src.Balance, amount)
		}
		if dst.Balance > math.MaxInt64-amount {
			return fmt.Errorf("%w: the recipient's balance cannot take %d cents more", ErrOverflow, amount)
		}
		src.Balance -= amount
		dst.Balance += amount
		out.FromBalance = src.Balance
		return guard.Work(ctx, s.delay)
	})
	return out, err
}

// refuseUnaffordable checks the sender's own balance before anything looks
// the recipient up: asking for more than one has must not tell whether an
// account exists (404 for a missing one, 422 for another user's). The read
// is unlocked and only refuses early; the locked read decides.
func refuseUnaffordable(ctx context.Context, store *Store, from, amount int64) error {
	if src, err := store.Get(ctx, from); err == nil && src.Balance < amount {
		return fmt.Errorf("%w: balance is %d cents, transfer asks %d", ErrInsufficientFunds, src.Balance, amount)
	}
	return nil
}
