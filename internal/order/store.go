package order

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/storage"
)

// writeTimeout bounds a write transaction, which runs detached from the
// request's cancellation: once begun it commits or rolls back whole, and
// the fences inside it decide whether a late write may land.
const writeTimeout = 5 * time.Second

// Fences are the tokens of the locks a change holds, one per row it may
// write; 0 writes that row unfenced (a backend that cannot fence, or none).
type Fences struct {
	Order   uint64 // lock:order:<id>
	Stock   uint64 // lock:stock:<sku>
	Account uint64 // lock:account:<user>
}

// Store keeps orders in SQL, and writes the stock and balance rows an order
// moves in the same transaction as the order, through the exported
// transaction steps of inventory and account.
type Store struct {
	db       *gorm.DB
	products *inventory.Store
	accounts *account.Store
	// beforeWrite, when set by a test, runs between the decision and the
	// transaction: the window a paused process sits in when its lease runs
	// out, or a SIGTERM or SIGKILL arrives.
	beforeWrite func(ctx context.Context)
	// committed, when set, is told the ids of the events a change
	// committed: the relay is woken, or (direct delivery) they are
	// published.
	committed func(ctx context.Context, ids ...string)
	// withoutEvents, set by the outbox's cost measurement, places orders
	// without their outbox rows: the baseline the outbox is compared to.
	withoutEvents bool
}

// NewStore returns a Store on db, which must translate driver errors
// (gorm.Config.TranslateError, as storage.Open sets it) so that a
// duplicate key reads as gorm.ErrDuplicatedKey. products and accounts are
// the stores on the same database. Migrate must have run.
func NewStore(db *gorm.DB, products *inventory.Store, accounts *account.Store) *Store {
	return &Store{db: db, products: products, accounts: accounts}
}

// Models are the tables of this package, for migrations: the orders and
// the outbox their changes write their events into.
func Models() []any { return append([]any{&Order{}}, events.Models()...) }

// OnCommit sets what the store tells, after a change's transaction
// committed, the ids of the events it wrote. Call it before the store
// serves.
func (s *Store) OnCommit(fn func(ctx context.Context, ids ...string)) { s.committed = fn }

// notify tells OnCommit's function about o's events of types.
func (s *Store) notify(ctx context.Context, o Order, types ...string) {
	if s.committed == nil {
		return
	}
	ids := make([]string, len(types))
	for i, t := range types {
		ids[i] = events.ID(o.ID, t)
	}
	s.committed(ctx, ids...)
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

// ByKey reads the order user placed with idempotency key key; ok is false
// when there is none.
func (s *Store) ByKey(ctx context.Context, user int64, key string) (o Order, ok bool, err error) {
	err = s.db.WithContext(ctx).Where("user_id = ? AND idempotency_key = ?", user, key).Take(&o).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Order{}, false, nil
	}
	return o, err == nil, err
}

// List returns up to limit orders of user with an id below before (0: from
// the newest), newest first.
func (s *Store) List(ctx context.Context, user, before int64, limit int) ([]Order, error) {
	q := s.db.WithContext(ctx).Where("user_id = ?", user)
	if before > 0 {
		q = q.Where("id < ?", before)
	}
	var out []Order
	err := q.Order("id DESC").Limit(limit).Find(&out).Error
	return out, err
}

// Expired returns the ids of up to limit orders still awaiting payment that
// were created at or before deadline, oldest first.
func (s *Store) Expired(ctx context.Context, deadline time.Time, limit int) ([]int64, error) {
	var ids []int64
	err := s.db.WithContext(ctx).Model(&Order{}).
		Where("status = ? AND created_at <= ?", StatusAwaitingPayment, deadline).
		Order("id").Limit(limit).Pluck("id", &ids).Error
	return ids, err
}

// Create places o: the order row, its stock reservation and, when decide
// made it paid, its debit, in one transaction. It claims the product (and
// the account, when f.Account is set) with their fences, reads the
// product, and lets decide fill in the amount and status. If an order with
// o's user and key exists, nothing is written and Create returns it with
// existing true.
func (s *Store) Create(ctx context.Context, o *Order, f Fences,
	decide func(ctx context.Context, o *Order, p inventory.Product) error) (existing bool, err error) {
	if found, ok, err := s.ByKey(ctx, o.UserID, o.IdempotencyKey); err != nil || ok {
		*o = found
		return ok, err
	}
	if err := s.decideNew(ctx, o, f, decide); err != nil {
		return false, err
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	err = s.db.WithContext(wctx).Transaction(func(tx *gorm.DB) error {
		return s.writeNew(ctx, tx, o, f)
	})
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		// Another run of the same request committed first.
		return s.placedByAnotherRun(wctx, o, err)
	}
	// Also after an error: a COMMIT whose reply was lost may have reserved.
	s.products.StockChanged(wctx, o.SKU)
	if err == nil {
		s.notify(wctx, *o, newEventTypes(*o)...)
	}
	return false, err
}

// decideNew claims the rows a new order writes, reads its product and lets
// decide fill in o, then makes the last check before the transaction.
func (s *Store) decideNew(ctx context.Context, o *Order, f Fences,
	decide func(ctx context.Context, o *Order, p inventory.Product) error) error {
	if err := s.products.Claim(ctx, o.SKU, f.Stock); err != nil {
		return err
	}
	if err := s.claimAccount(ctx, o.UserID, f.Account); err != nil {
		return err
	}
	p, err := s.products.Get(ctx, o.SKU)
	if err != nil {
		return err
	}
	if err := decide(ctx, o, p); err != nil {
		return err
	}
	return s.ready(ctx)
}

// writeNew writes, in tx, the order row, its reservation, its debit if it
// is paid, its events, and the record of the request that placed it
// (ctx's).
func (s *Store) writeNew(ctx context.Context, tx *gorm.DB, o *Order, f Fences) error {
	if err := tx.Create(o).Error; err != nil {
		return err
	}
	reservation := inventory.Purchase{SKU: o.SKU, UserID: o.UserID, Quantity: o.Quantity, OrderID: o.ID}
	if err := inventory.Reserve(tx, &reservation, f.Stock); err != nil {
		return err
	}
	if o.Status == StatusPaid && o.AmountCents > 0 {
		if err := account.Debit(tx, o.UserID, o.AmountCents, f.Account, o.ID); err != nil {
			return err
		}
	}
	for _, t := range newEventTypes(*o) {
		if s.withoutEvents {
			break
		}
		if err := events.Append(ctx, tx, eventOf(*o, t)); err != nil {
			return err
		}
	}
	// The token's record, so that a retry finds this order even when
	// Redis has lost the token.
	return keyed.Save(ctx, tx)
}

// placedByAnotherRun reads into o the order that the run whose commit beat
// this one's (err, a duplicate key) placed with o's user and key.
func (s *Store) placedByAnotherRun(ctx context.Context, o *Order, err error) (bool, error) {
	found, ok, ferr := s.ByKey(ctx, o.UserID, o.IdempotencyKey)
	if ferr != nil || !ok {
		return false, errors.Join(err, ferr)
	}
	*o = found
	return true, nil
}

// Update is the read-modify-write of order id, in the shape of a
// repository that takes the change as a function: it claims the order row
// with f.Order, reads it, claims the stock and account rows it may move
// (f.Stock, f.Account), lets fn change the order's status, then writes in
// one transaction the order and what its new status moves: a debit for
// paid, the stock's return for cancelled. When fn leaves the status as it
// was, nothing is written. Update returns the order as it now stands.
func (s *Store) Update(ctx context.Context, id int64, f Fences, fn func(ctx context.Context, o *Order) error) (Order, error) {
	o, err := s.claimAndGet(ctx, id, f)
	if err != nil {
		return o, err
	}
	before := o
	if err := fn(ctx, &o); err != nil {
		return before, err
	}
	if o.Status == before.Status {
		return o, nil
	}
	if err := s.ready(ctx); err != nil {
		return before, err
	}
	if err := s.writeChange(ctx, o, f); err != nil {
		return before, err
	}
	return o, nil
}

// claimAndGet claims order id with f.Order, reads it, and claims the stock
// and account rows it may move with f.Stock and f.Account. The order is
// zero when it could not be read.
func (s *Store) claimAndGet(ctx context.Context, id int64, f Fences) (Order, error) {
	if err := s.claim(ctx, id, f.Order); err != nil {
		return Order{}, err
	}
	o, err := s.Get(ctx, id)
	if err != nil {
		return Order{}, err
	}
	if f.Stock != 0 {
		if err := s.products.Claim(ctx, o.SKU, f.Stock); err != nil {
			return o, err
		}
	}
	return o, s.claimAccount(ctx, o.UserID, f.Account)
}

// claimAccount claims account user with fence; 0 claims nothing.
func (s *Store) claimAccount(ctx context.Context, user int64, fence uint64) error {
	if fence == 0 {
		return nil
	}
	return s.accounts.Claim(ctx, user, fence)
}

// writeChange writes o's new status and what it moves in one transaction.
func (s *Store) writeChange(ctx context.Context, o Order, f Fences) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	err := s.db.WithContext(wctx).Transaction(func(tx *gorm.DB) error {
		if err := writeStatus(tx, o, f.Order); err != nil {
			return err
		}
		if err := writeMoves(tx, o, f); err != nil {
			return err
		}
		return events.Append(ctx, tx, eventOf(o, statusEventType(o.Status)))
	})
	if o.Status == StatusCancelled {
		// Also after an error: a COMMIT whose reply was lost may have
		// returned the units.
		s.products.StockChanged(wctx, o.SKU)
	}
	if err == nil {
		s.notify(wctx, o, statusEventType(o.Status))
	}
	return err
}

// writeMoves writes in tx what o's new status moves: a debit for paid, the
// stock's return for cancelled.
func writeMoves(tx *gorm.DB, o Order, f Fences) error {
	switch o.Status {
	case StatusPaid:
		if o.AmountCents > 0 {
			return account.Debit(tx, o.UserID, o.AmountCents, f.Account, o.ID)
		}
	case StatusCancelled:
		back := inventory.Purchase{SKU: o.SKU, UserID: o.UserID, Quantity: o.Quantity, OrderID: o.ID}
		return inventory.Return(tx, &back, f.Stock)
	}
	return nil
}

// ready is the last check before a transaction: a lost lease or a client
// that left stops the change here, where nothing is written yet. Past it
// the transaction runs to its end.
func (s *Store) ready(ctx context.Context) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if s.beforeWrite != nil {
		s.beforeWrite(ctx)
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
	}
	return nil
}

// orders are the fenced rows of this store (storage.Fenced says how a
// claim and a fenced write keep a stale holder out).
var orders = storage.Fenced{Table: "orders", Key: "id", Noun: "order", NotFound: ErrNotFound}

// claim claims order id before Update reads it; 0 claims nothing.
func (s *Store) claim(ctx context.Context, id int64, fence uint64) error {
	return orders.Claim(ctx, s.db, id, fence)
}

// writeStatus is the order's fenced write: it lands only while the row
// still carries the token Update claimed it with. It sets the status as
// fn decided, without a condition on the status it read: the lock and the
// fence are what keep two changes apart, so that the none baseline shows
// what they prevent (an order both paid and cancelled).
func writeStatus(tx *gorm.DB, o Order, fence uint64) error {
	written, err := orders.Update(tx, o.ID, fence, storage.Change{
		Set:  "status = ?, paid_at = ?, cancelled_at = ?, updated_at = ?",
		Args: []any{o.Status, o.PaidAt, o.CancelledAt, time.Now().UTC()},
	})
	if err != nil {
		return err
	}
	if !written {
		if fence == 0 {
			return fmt.Errorf("%w: order %d was deleted while in use", ErrNotFound, o.ID)
		}
		return orders.Refused(o.ID, fence)
	}
	return nil
}

// Reset deletes every order and the outbox of their events: no fixture
// has any. It implements the order half of audit.Resetter.
func (s *Store) Reset(ctx context.Context, _ string) error {
	return storage.Conn(ctx, s.db).Transaction(func(tx *gorm.DB) error {
		if err := tx.Where("1 = 1").Delete(&Order{}).Error; err != nil {
			return err
		}
		return events.NewOutbox(tx).Reset(ctx)
	})
}

// ForgetFences sets every order's fence to 0, for the embedded Redis whose
// counters start over (see cmd/shop).
func (s *Store) ForgetFences(ctx context.Context) error {
	return s.db.WithContext(ctx).Model(&Order{}).Where("fence <> 0").Update("fence", 0).Error
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
