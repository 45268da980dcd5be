package inventory

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/storage"
)

// Strategies of the purchase rows orders write.
const (
	// StrategyOrder marks an order's reservation (quantity > 0).
	StrategyOrder = "order"
	// StrategyOrderReturn marks the units a cancelled order gave back
	// (quantity < 0), so that sums over purchases stay the units sold.
	StrategyOrderReturn = "order-return"
)

// Claim raises sku's fence to fence before the caller writes it, as
// Update does (storage.Fenced says why the claim comes first). A fence of 0
// claims nothing. It returns ErrNotFound, or lockkit.ErrFenced when a
// newer token holds the row.
func (s *Store) Claim(ctx context.Context, sku string, fence uint64) error {
	return s.claim(ctx, sku, fence)
}

// StockChanged tells the Redis mirror (atomic-redis) that sku's stock
// moved behind its back: an order reserved or returned units. Call it
// after the transaction committed.
func (s *Store) StockChanged(ctx context.Context, sku string) {
	if s.mirror != nil {
		s.mirror.Forget(ctx, sku)
	}
}

// Reserve takes p.Quantity units of p.SKU for order p.OrderID inside the
// caller's transaction tx: the per-user limit, the stock and the purchase
// row p (strategy "order") land together or not at all. The write is
// fenced (fence as claimed with Claim; 0 writes unfenced) and guarded by
// the stock itself, so that it never oversells, whatever decided it, and
// never loses a decrement of a strategy that takes no lock (atomic-sql).
func Reserve(tx *gorm.DB, p *Purchase, fence uint64) error {
	if p.Quantity <= 0 {
		return fmt.Errorf("%w: quantity must be a positive integer, got %d", ErrInvalidQuantity, p.Quantity)
	}
	var prod Product
	if err := tx.Where("sku = ?", p.SKU).Take(&prod).Error; errors.Is(err, gorm.ErrRecordNotFound) {
		return fmt.Errorf("%w: no product %q", ErrNotFound, p.SKU)
	} else if err != nil {
		return err
	}
	if err := countLimit(tx, prod, *p); err != nil {
		return err
	}
	if err := moveStock(tx, p.SKU, -p.Quantity, fence, nil); err != nil {
		return err
	}
	p.Strategy, p.Fence = StrategyOrder, fence
	return createInSale(tx, p)
}

// Return gives back the units of order p.OrderID inside the caller's
// transaction tx: the stock, the per-user total and a purchase row of
// -p.Quantity units (strategy "order-return") land together, in the sale
// of the reservation.
//
// A reservation of an older sale (an admin PUT of the product came
// between) moves no stock and no per-user total: its units are not the new
// sale's to take back, and returning them would create stock. Its return
// row is still written, in the old sale, so that the order reconciles.
func Return(tx *gorm.DB, p *Purchase, fence uint64) error {
	if p.Quantity <= 0 {
		return fmt.Errorf("%w: quantity must be a positive integer, got %d", ErrInvalidQuantity, p.Quantity)
	}
	var sales []int64
	if err := tx.Model(&Purchase{}).Where("order_id = ? AND sku = ? AND quantity > 0", p.OrderID, p.SKU).
		Limit(1).Pluck("sale", &sales).Error; err != nil {
		return err
	}
	if len(sales) == 0 {
		// Dropped by a PUT of a version that deleted the old sale's rows:
		// nothing to give back, nothing to reconcile against.
		return nil
	}
	sale := sales[0]
	if err := giveBack(tx, *p, fence, sale); err != nil {
		return err
	}
	ret := *p
	ret.Quantity, ret.Strategy, ret.Fence, ret.Sale = -p.Quantity, StrategyOrderReturn, fence, sale
	if err := tx.Create(&ret).Error; err != nil {
		return err
	}
	*p = ret
	return nil
}

// giveBack returns p's units to the stock and to the user's total, unless
// sale is no longer the product's.
func giveBack(tx *gorm.DB, p Purchase, fence uint64, sale int64) error {
	switch err := moveStock(tx, p.SKU, p.Quantity, fence, &sale); {
	case errors.Is(err, errOtherSale):
		return nil
	case err != nil:
		return err
	}
	// The units no longer count against the user's limit: they were
	// never sold. No row means no limit applied to them.
	return tx.Exec("UPDATE purchase_limits SET units = units - ? WHERE user_id = ? AND sku = ? AND units >= ?",
		p.Quantity, p.UserID, p.SKU, p.Quantity).Error
}

// errOtherSale: moveStock was told a sale that is no longer the product's.
var errOtherSale = errors.New("inventory: the product's sale has changed")

// moveStock adds delta to sku's stock, refusing to go below zero, fenced
// unless fence is 0, and, when sale is not nil, only within that sale
// (errOtherSale otherwise): checked in the UPDATE itself, so that a PUT
// cannot start a new sale between the check and the write. It bumps the
// version like every write of the stock, so that an optimistic writer
// that read the row before sees it changed.
func moveStock(tx *gorm.DB, sku string, delta int64, fence uint64, sale *int64) error {
	c := storage.Change{Set: "stock = stock + ?, version = version + 1, updated_at = ?", Guard: "stock + ? >= 0",
		Args: []any{delta, time.Now().UTC(), delta}}
	if sale != nil {
		c.Guard, c.Args = c.Guard+" AND sale = ?", append(c.Args, *sale)
	}
	if written, err := products.Update(tx, sku, fence, c); written || err != nil {
		return err
	}
	return whyNotMoved(tx, sku, delta, fence, sale)
}

// whyNotMoved reads sku's row to tell why moveStock's UPDATE matched
// nothing: no product, a newer fence, another sale, or too little stock.
func whyNotMoved(tx *gorm.DB, sku string, delta int64, fence uint64, sale *int64) error {
	var prod Product
	err := tx.Where("sku = ?", sku).Take(&prod).Error
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound):
		return fmt.Errorf("%w: no product %q", ErrNotFound, sku)
	case err != nil:
		return err
	case fence != 0 && prod.Fence != fence:
		return products.Refused(sku, fence)
	case sale != nil && prod.Sale != *sale:
		return fmt.Errorf("%w: %q is in sale %d, not %d", errOtherSale, sku, prod.Sale, *sale)
	}
	return soldOut(prod.Stock, -delta)
}

// OrderUnits are the purchase rows of one order, for the order audit.
type OrderUnits struct {
	Reserved, ReservedRows int64 // units and rows taken (quantity > 0)
	Returned, ReturnedRows int64 // units and rows given back (quantity < 0), units positive
	// Reservations and Returns bound the SKUs and sales the rows moved
	// stock in: one SKU and one sale each when every row is the order's.
	Reservations, Returns Span
}

// Span is the least and the greatest (SKU, sale) of some purchase rows.
type Span struct {
	MinSKU, MaxSKU   string
	MinSale, MaxSale int64
}

// Single reports whether the rows all moved stock of one SKU in one sale.
func (s Span) Single() bool { return s.MinSKU == s.MaxSKU && s.MinSale == s.MaxSale }

// orderStockQuery sums the purchase rows of each order. MIN and MAX skip
// the NULLs of the other kind's rows; COALESCE makes "no row of this kind"
// read as an empty span.
const orderStockQuery = `SELECT order_id,
		COALESCE(SUM(CASE WHEN quantity > 0 THEN quantity ELSE 0 END), 0) AS reserved,
		COALESCE(SUM(CASE WHEN quantity > 0 THEN 1 ELSE 0 END), 0) AS res_rows,
		COALESCE(SUM(CASE WHEN quantity < 0 THEN -quantity ELSE 0 END), 0) AS returned,
		COALESCE(SUM(CASE WHEN quantity < 0 THEN 1 ELSE 0 END), 0) AS ret_rows,
		COALESCE(MIN(CASE WHEN quantity > 0 THEN sku END), '') AS res_min_sku,
		COALESCE(MAX(CASE WHEN quantity > 0 THEN sku END), '') AS res_max_sku,
		COALESCE(MIN(CASE WHEN quantity > 0 THEN sale END), 0) AS res_min_sale,
		COALESCE(MAX(CASE WHEN quantity > 0 THEN sale END), 0) AS res_max_sale,
		COALESCE(MIN(CASE WHEN quantity < 0 THEN sku END), '') AS ret_min_sku,
		COALESCE(MAX(CASE WHEN quantity < 0 THEN sku END), '') AS ret_max_sku,
		COALESCE(MIN(CASE WHEN quantity < 0 THEN sale END), 0) AS ret_min_sale,
		COALESCE(MAX(CASE WHEN quantity < 0 THEN sale END), 0) AS ret_max_sale
		FROM purchases WHERE order_id <> 0 GROUP BY order_id`

// OrderStock returns the purchase rows of orders by order id, read with tx
// so that the caller can read them in the same snapshot as the orders.
func OrderStock(tx *gorm.DB) (map[int64]OrderUnits, error) {
	var rows []struct {
		OrderID                int64
		Reserved, ResRows      int64
		Returned, RetRows      int64
		ResMinSKU, ResMaxSKU   string
		ResMinSale, ResMaxSale int64
		RetMinSKU, RetMaxSKU   string
		RetMinSale, RetMaxSale int64
	}
	err := tx.Raw(orderStockQuery).Scan(&rows).Error
	out := make(map[int64]OrderUnits, len(rows))
	for _, r := range rows {
		out[r.OrderID] = OrderUnits{Reserved: r.Reserved, ReservedRows: r.ResRows, Returned: r.Returned, ReturnedRows: r.RetRows,
			Reservations: Span{MinSKU: r.ResMinSKU, MaxSKU: r.ResMaxSKU, MinSale: r.ResMinSale, MaxSale: r.ResMaxSale},
			Returns:      Span{MinSKU: r.RetMinSKU, MaxSKU: r.RetMaxSKU, MinSale: r.RetMinSale, MaxSale: r.RetMaxSale}}
	}
	return out, err
}
