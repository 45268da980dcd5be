package order

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/account"
)

// DefaultMaxUnpaidUnits is how many units one user may hold in orders
// awaiting payment when Options say nothing (SHOP_ORDER_MAX_UNPAID_UNITS'
// default): five times the largest per-user limit of the fixtures (2), so
// that a buyer never meets it, while holding a 50-unit sale for the pay
// timeout takes five accounts, each with the money for its ten units.
const DefaultMaxUnpaidUnits = 10

// held is what one user's orders awaiting payment hold.
type held struct {
	Units int64
	Cents int64
}

// unpaid reads what user's orders awaiting payment hold.
func (s *Store) unpaid(ctx context.Context, user int64) (held, error) {
	var h held
	err := s.db.WithContext(ctx).Model(&Order{}).
		Select("COALESCE(SUM(quantity), 0) AS units, COALESCE(SUM(amount_cents), 0) AS cents").
		Where("user_id = ? AND status = ?", user, StatusAwaitingPayment).Scan(&h).Error
	return h, err
}

// checkUnpaid refuses o, an order to be left awaiting payment, if it would
// take its user past the units one user may hold unpaid (ErrUnpaidLimit)
// or past what the balance can pay for all of them
// (account.ErrInsufficientFunds): a reservation holds stock from every
// other buyer for the pay timeout, so it needs a way to be paid. It runs
// under lock:account:<user>, so one user's orders are counted one at a
// time.
func (s *Service) checkUnpaid(ctx context.Context, o *Order) error {
	h, err := s.store.unpaid(ctx, o.UserID)
	if err != nil {
		return err
	}
	if o.Quantity > s.o.MaxUnpaidUnits-h.Units {
		return fmt.Errorf("%w: you hold %d units in unpaid orders and asked %d more; at most %d per user: pay or let them lapse first",
			ErrUnpaidLimit, h.Units, o.Quantity, s.o.MaxUnpaidUnits)
	}
	a, err := s.store.accounts.Get(ctx, o.UserID)
	if err != nil {
		return err
	}
	if o.AmountCents > a.Balance || h.Cents > a.Balance-o.AmountCents {
		return fmt.Errorf("%w: your unpaid orders would come to %d + %d cents, over the balance of %d",
			account.ErrInsufficientFunds, h.Cents, o.AmountCents, a.Balance)
	}
	return nil
}

const reservedUnpaidHelp = "Units of stock reserved by orders awaiting payment, per SKU."

// reservedUnpaid exports, at each scrape, the units held by orders
// awaiting payment per SKU: stock that no buyer can take until its order
// is paid or cancelled.
type reservedUnpaid struct {
	store *Store
	desc  *prometheus.Desc
}

// ReservedUnpaidCollector returns the collector of
// shop_order_reserved_unpaid_units{sku}. One statement per scrape, over
// the orders awaiting payment only (the status index).
func (s *Store) ReservedUnpaidCollector() prometheus.Collector {
	return reservedUnpaid{store: s, desc: prometheus.NewDesc("shop_order_reserved_unpaid_units", reservedUnpaidHelp, []string{"sku"}, nil)}
}

func (r reservedUnpaid) Describe(ch chan<- *prometheus.Desc) { ch <- r.desc }

func (r reservedUnpaid) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var rows []struct {
		SKU   string
		Units int64
	}
	err := r.store.db.WithContext(ctx).Model(&Order{}).Select("sku, SUM(quantity) AS units").
		Where("status = ?", StatusAwaitingPayment).Group("sku").Scan(&rows).Error
	if err != nil {
		ch <- prometheus.NewInvalidMetric(r.desc, err)
		return
	}
	for _, row := range rows {
		ch <- prometheus.MustNewConstMetric(r.desc, prometheus.GaugeValue, float64(row.Units), row.SKU)
	}
}
