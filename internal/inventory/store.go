package inventory

import (
	"cmp"
	"context"
	"errors"
	"fmt"
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

// Store keeps products, purchases and per-user totals in SQL.
type Store struct {
	db *gorm.DB
	// mirror, when set, is told about products that change behind its back
	// (admin puts and resets).
	mirror *Mirror
	// beforeWrite, when set by a test, runs between the decision and the
	// write: the window a paused process sits in when its lease runs out.
	beforeWrite func(ctx context.Context)
}

// NewStore returns a Store on db. Migrate must have run. mirror may be nil.
func NewStore(db *gorm.DB, mirror *Mirror) *Store { return &Store{db: db, mirror: mirror} }

// Models are the tables of this package, for migrations.
func Models() []any { return []any{&Product{}, &Purchase{}, &PurchaseLimit{}} }

// Get reads one product. A malformed SKU names none (CheckSKU), on every
// database.
func (s *Store) Get(ctx context.Context, sku string) (Product, error) {
	if err := CheckSKU(sku); err != nil {
		return Product{}, err
	}
	var p Product
	err := s.db.WithContext(ctx).Where("sku = ?", sku).Take(&p).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Product{}, fmt.Errorf("%w: no product %q", ErrNotFound, sku)
	}
	return p, err
}

// Update is the lock strategy's read-modify-write under the lock whose
// token is fence (recorded in p.Fence): it claims the product with fence,
// reads it, lets fn lower its stock, then in one transaction
// writes the stock (fenced), counts the units against the per-user limit
// and inserts the purchase p. A fence that does not beat the row's at the
// claim, or that a newer token has replaced by the write, makes Update
// return lockkit.ErrFenced with nothing written; a fence of 0 skips the
// claim and writes unfenced.
//
// The claim comes before the read (storage.Fenced says why). The claim is
// its own autocommit statement and the read a plain SELECT outside the
// transaction: no row lock is held while fn runs; the caller's lock
// serializes, the fence catches a holder whose lock ran out.
func (s *Store) Update(ctx context.Context, p *Purchase, fence uint64, fn func(ctx context.Context, prod *Product) error) error {
	p.Fence = fence
	if err := s.claim(ctx, p.SKU, fence); err != nil {
		return err
	}
	prod, err := s.Get(ctx, p.SKU)
	if err != nil {
		return err
	}
	if err := fn(ctx, &prod); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	if s.beforeWrite != nil {
		s.beforeWrite(ctx)
	}
	// The write finishes even if the request or the lease ends meanwhile: a
	// transaction cut half-way leaves its outcome unknown to the client,
	// and the fence inside it decides whether a late write may land.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	return s.db.WithContext(wctx).Transaction(func(tx *gorm.DB) error {
		return writeSale(ctx, tx, prod, p, fence)
	})
}

// writeSale writes, in tx, the sale Update decided: the per-user total,
// the stock prod now has (fenced), the purchase row p and the record of
// the request that made it (ctx's).
func writeSale(ctx context.Context, tx *gorm.DB, prod Product, p *Purchase, fence uint64) error {
	if err := countLimit(tx, prod, *p); err != nil {
		return err
	}
	if err := writeStock(tx, prod, fence); err != nil {
		return err
	}
	if err := insertInSale(tx, p); err != nil {
		return err
	}
	return keyed.Save(ctx, tx)
}

// products are the fenced rows of this store (storage.Fenced says how a
// claim and a fenced write keep a stale holder out).
var products = storage.Fenced{Table: "products", Key: "sku", Noun: "product", NotFound: ErrNotFound}

// claim claims the product before Update reads it: a token claims a row at
// most once, so a replay under the same grant is refused, not applied
// twice.
func (s *Store) claim(ctx context.Context, sku string, fence uint64) error {
	return products.Claim(ctx, s.db, sku, fence)
}

// writeStock is the fenced write: it lands only while the row's fence is
// still the token Update claimed it with, that is, while no newer holder
// has claimed the row since this one read it, and while its version is the
// one read: an optimistic writer, which takes no lock (a rolling switch of
// SHOP_STOCK_STRATEGY runs both), must not be overwritten either. Unfenced
// (fence 0: none, or a backend that cannot fence) it checks nothing, which
// is what lets the none baseline lose updates; it still bumps the version
// so that optimistic writers see it.
func writeStock(tx *gorm.DB, prod Product, fence uint64) error {
	c := storage.Change{Set: "stock = ?, version = version + 1, updated_at = ?", Args: []any{prod.Stock, time.Now().UTC()}}
	if fence != 0 {
		c.Guard, c.Args = "version = ?", append(c.Args, prod.Version)
	}
	written, err := products.Update(tx, prod.SKU, fence, c)
	if err != nil {
		return err
	}
	if !written {
		if fence == 0 {
			return fmt.Errorf("%w: product %q was deleted while in use", ErrNotFound, prod.SKU)
		}
		var cur Product
		if err := tx.Where("sku = ?", prod.SKU).Take(&cur).Error; err == nil && cur.Fence == fence {
			return fmt.Errorf("%w: product %q was written outside lock %d", optimistic.ErrConflict, prod.SKU, fence)
		}
		return products.Refused(prod.SKU, fence)
	}
	return nil
}

// Decrement is the atomic strategies' write: one transaction with the
// guarded UPDATE (stock >= quantity is checked by the database, in the same
// statement that decrements), the per-user limit and the purchase row.
//
// A product without a per-user limit (the hot path of a flash sale) takes
// no read: the UPDATE's own condition tells it from a limited one, and the
// transaction is UPDATE + INSERT. Only when the UPDATE matches nothing
// (sold out, unknown SKU, or a limit to count) is the row read.
func (s *Store) Decrement(ctx context.Context, p *Purchase) error {
	return s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		res := tx.Exec("UPDATE products SET stock = stock - ?, version = version + 1, updated_at = ? WHERE sku = ? AND stock >= ? AND per_user_limit = 0",
			p.Quantity, time.Now().UTC(), p.SKU, p.Quantity)
		if res.Error != nil {
			return res.Error
		}
		if res.RowsAffected == 0 {
			if err := decrementRead(tx, p); err != nil {
				return err
			}
		}
		if err := insertInSale(tx, p); err != nil {
			return err
		}
		return keyed.Save(ctx, tx)
	})
}

// decrementRead is Decrement's path when its UPDATE matched nothing: it
// reads the row to tell an unknown SKU or a sold-out product from a limit
// to count, and with a limit counts p's units and decrements.
func decrementRead(tx *gorm.DB, p *Purchase) error {
	var prod Product
	if err := tx.Where("sku = ?", p.SKU).Take(&prod).Error; errors.Is(err, gorm.ErrRecordNotFound) {
		return fmt.Errorf("%w: no product %q", ErrNotFound, p.SKU)
	} else if err != nil {
		return err
	}
	if prod.PerUserLimit <= 0 {
		return decrementSoldOut(p.Quantity)
	}
	if err := countLimit(tx, prod, *p); err != nil {
		return err
	}
	res := tx.Exec("UPDATE products SET stock = stock - ?, version = version + 1, updated_at = ? WHERE sku = ? AND stock >= ?",
		p.Quantity, time.Now().UTC(), p.SKU, p.Quantity)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected == 0 {
		return decrementSoldOut(p.Quantity)
	}
	return nil
}

// insertInSale inserts p as a row of its product's current sale. Call it
// after the transaction tx wrote the product's row: the write holds the
// row until commit, so no admin put can start a new sale in between, and
// the row lands in the sale whose stock it took. The sale is read by the
// INSERT itself: inside a critical section every round trip is paid by
// each buyer queued behind it. It runs on the transaction's connection,
// past gorm's callbacks, so the slow-query log does not see it.
func insertInSale(tx *gorm.DB, p *Purchase) error {
	if p.CreatedAt.IsZero() {
		p.CreatedAt = tx.NowFunc()
	}
	res, err := tx.Statement.ConnPool.ExecContext(tx.Statement.Context,
		`INSERT INTO purchases (sku, user_id, quantity, strategy, fence, created_at, order_id, sale)
		SELECT ?, ?, ?, ?, ?, ?, ?, sale FROM products WHERE sku = ?`,
		p.SKU, p.UserID, p.Quantity, p.Strategy, p.Fence, p.CreatedAt, p.OrderID, p.SKU)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return cmp.Or(err, fmt.Errorf("%w: %s", ErrNotFound, p.SKU))
	}
	p.ID, err = res.LastInsertId()
	return err
}

// createInSale is insertInSale through gorm's Create, for the order
// flows: their rows stay in gorm's callbacks, which the slow-query log and
// the order tests' hang-up and fault hooks use. The same rule holds: call
// it after tx wrote the product's row, which it then holds until commit,
// so that the subquery reads the sale whose stock the row moved. The sale
// is read by the INSERT, not by a statement of its own: every round trip
// of an order flow is paid inside its transaction, under the locks of the
// rows it holds. It sets p.ID, not p.Sale (reading it back would be the
// round trip saved).
func createInSale(tx *gorm.DB, p *Purchase) error {
	if p.CreatedAt.IsZero() {
		p.CreatedAt = tx.NowFunc()
	}
	row := map[string]any{
		"sku": p.SKU, "user_id": p.UserID, "quantity": p.Quantity, "strategy": p.Strategy,
		"fence": p.Fence, "created_at": p.CreatedAt, "order_id": p.OrderID,
		"sale": gorm.Expr("(SELECT sale FROM products WHERE sku = ?)", p.SKU),
	}
	if err := tx.Model(&Purchase{}).Create(row).Error; err != nil {
		return err
	}
	id, ok := row["id"].(int64)
	if !ok {
		return fmt.Errorf("inventory: the purchase row of %q came back without an id: %v", p.SKU, row["id"])
	}
	p.ID = id
	return nil
}

// currentSale reads sku's sale in a statement of its own: for combined
// batches, which pay it once per batch, not once per buyer.
func currentSale(tx *gorm.DB, sku string) (int64, error) {
	var sale int64
	err := tx.Raw("SELECT sale FROM products WHERE sku = ?", sku).Scan(&sale).Error
	return sale, err
}

func decrementSoldOut(quantity int64) error {
	if quantity == 1 {
		return fmt.Errorf("%w: no units left", ErrSoldOut)
	}
	return fmt.Errorf("%w: fewer than %d left", ErrSoldOut, quantity)
}

// countLimit adds p's units to the user's total for the SKU, refusing when
// the total would pass the product's limit. One conditional UPDATE does the
// check and the add, so that two concurrent purchases of one user cannot
// both pass, whatever the strategy.
func countLimit(tx *gorm.DB, prod Product, p Purchase) error {
	if prod.PerUserLimit <= 0 {
		return nil
	}
	if p.Quantity > prod.PerUserLimit {
		return fmt.Errorf("%w: at most %d per user, %d asked", ErrLimitExceeded, prod.PerUserLimit, p.Quantity)
	}
	row := PurchaseLimit{UserID: p.UserID, SKU: p.SKU}
	if err := tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&row).Error; err != nil {
		return err
	}
	res := tx.Exec("UPDATE purchase_limits SET units = units + ? WHERE user_id = ? AND sku = ? AND units + ? <= ?",
		p.Quantity, p.UserID, p.SKU, p.Quantity, prod.PerUserLimit)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("%w: at most %d per user; you may have bought some already", ErrLimitExceeded, prod.PerUserLimit)
	}
	return nil
}

// Put creates or replaces a product with stock as both its stock and its
// initial stock. Replacing starts a new sale: the per-user totals are
// deleted, and the purchase rows stay, as the old sale's (the orders that
// reserved them still reconcile against them) but no longer count in the
// stock audit. The same statement raises the row's version, so that a
// holder that read the stock before the put is refused when it writes
// (optimistic.ErrConflict: its write checks the version it read). The
// fence is kept, not raised: a backend whose tokens count by one would
// otherwise see its next grant refused.
func (s *Store) Put(ctx context.Context, p Product) (created bool, err error) {
	p.InitialStock = p.Stock
	err = s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		// One statement tells a replacement, starts its sale (two puts at
		// once start two) and refuses every earlier reader's write.
		res := tx.Exec("UPDATE products SET sale = sale + 1, version = version + 1 WHERE sku = ?", p.SKU)
		if res.Error != nil {
			return res.Error
		}
		created = res.RowsAffected == 0
		if err := tx.Where("sku = ?", p.SKU).Delete(&PurchaseLimit{}).Error; err != nil {
			return err
		}
		return upsert(tx, []Product{p})
	})
	// Also after an error (a COMMIT whose reply was lost may have landed),
	// and after the client left: the mirror must not keep the old stock.
	if s.mirror != nil {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		s.mirror.Forget(fctx, p.SKU)
	}
	return created, err
}

func upsert(tx *gorm.DB, ps []Product) error {
	return tx.Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "sku"}},
		DoUpdates: clause.AssignmentColumns([]string{"name", "stock", "initial_stock", "price_cents", "per_user_limit", "updated_at"}),
	}).CreateInBatches(&ps, 500).Error
}

// fixtures are the products of each named fixture (see docs/api.md).
var fixtures = map[string][]Product{
	"default": {
		{SKU: "phone-x", Name: "Phone X launch edition", Stock: 50, PriceCents: 49_900},
		{SKU: "sneaker-1", Name: "Limited sneaker", Stock: 10, PriceCents: 12_000, PerUserLimit: 1},
	},
	"loadtest": {
		{SKU: "lt-hot", Name: "Load test hot item", Stock: 100, PriceCents: 1_000},
		{SKU: "lt-limited", Name: "Load test limited item", Stock: 1000, PriceCents: 500, PerUserLimit: 2},
	},
}

// Reset replaces every product, purchase and per-user total with the
// fixture's products. Fences of products that stay are kept, and each
// starts a new sale with a new version in the same transaction, as Put
// does: a holder that claimed and read a product before the reset is
// refused when it writes (optimistic.ErrConflict), whatever its token, and
// a row written in the old sale does not count in the new one.
func (s *Store) Reset(ctx context.Context, fixture string) error {
	ps, ok := fixtures[fixture]
	if !ok {
		return fmt.Errorf("inventory: no fixture %q", fixture)
	}
	ps = append([]Product(nil), ps...)
	skus := make([]string, len(ps))
	for i := range ps {
		ps[i].InitialStock = ps[i].Stock
		skus[i] = ps[i].SKU
	}
	var old []string
	err := storage.Conn(ctx, s.db).Transaction(func(tx *gorm.DB) (err error) {
		old, err = replaceProducts(tx, ps, skus)
		return err
	})
	if err == nil && s.mirror != nil {
		for _, sku := range append(old, skus...) {
			s.mirror.Forget(ctx, sku)
		}
	}
	return err
}

// replaceProducts deletes, in tx, every purchase, every per-user total and
// the products not in skus, and upserts ps (whose SKUs skus are). It
// returns the SKUs there were before.
func replaceProducts(tx *gorm.DB, ps []Product, skus []string) (old []string, err error) {
	if err := tx.Model(&Product{}).Pluck("sku", &old).Error; err != nil {
		return nil, err
	}
	for _, m := range []any{&Purchase{}, &PurchaseLimit{}} {
		if err := tx.Where("1 = 1").Delete(m).Error; err != nil {
			return nil, err
		}
	}
	if err := tx.Where("sku NOT IN ?", skus).Delete(&Product{}).Error; err != nil {
		return nil, err
	}
	if err := tx.Exec("UPDATE products SET sale = sale + 1, version = version + 1").Error; err != nil {
		return nil, err
	}
	return old, upsert(tx, ps)
}

// sold is the audit's view of one product in its current sale, read in one
// statement.
type sold struct {
	SKU          string
	Stock        int64
	InitialStock int64
	Units        int64
}

func (s *Store) sold(ctx context.Context) ([]sold, error) {
	var rows []sold
	err := s.db.WithContext(ctx).Raw(`
		SELECT p.sku AS sku, p.stock AS stock, p.initial_stock AS initial_stock,
		       COALESCE(SUM(pu.quantity), 0) AS units
		FROM products p LEFT JOIN purchases pu ON pu.sku = p.sku AND pu.sale = p.sale
		GROUP BY p.sku, p.stock, p.initial_stock`).Scan(&rows).Error
	return rows, err
}

// Oversold is the audit check: per SKU, the units in purchase rows beyond
// the initial stock.
func (s *Store) Oversold(ctx context.Context) (map[string]int64, error) {
	rows, err := s.sold(ctx)
	out := map[string]int64{}
	for _, r := range rows {
		if over := r.Units - r.InitialStock; over > 0 {
			out[r.SKU] = over
		}
	}
	return out, err
}

// StockDrift is the audit check of lost stock updates: per SKU, stock -
// (initial stock - units sold). Positive means units were sold whose
// decrement was lost (they will be sold again); negative means stock
// vanished without a sale.
func (s *Store) StockDrift(ctx context.Context) (map[string]int64, error) {
	rows, err := s.sold(ctx)
	out := map[string]int64{}
	for _, r := range rows {
		if d := r.Stock - (r.InitialStock - r.Units); d != 0 {
			out[r.SKU] = d
		}
	}
	return out, err
}
