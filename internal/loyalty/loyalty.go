// Package loyalty is a loyalty-points ledger fed by order events: each paid
// order credits its user one point per whole 100 cents of its amount
// (PointsFor). It is the consumer side of package events, and its effect
// is deliberately not idempotent by nature: a credit applied twice is
// twice the points. Only the consumer's dedup (events.Dedup) keeps a
// redelivered order.paid from paying out again, and the audit counts the
// points that do not match the paid orders.
//
// The points come from the order row, not from the event: the event only
// says which order was paid. An event naming an order that does not exist,
// or one that is not paid, is rejected (dead-lettered). Nothing here
// writes an order, a balance or a stock: the consumer cannot move the
// shop's money or goods.
package loyalty

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/order"
	"github.com/lockbench/shop/internal/storage"
)

// ConsumerName is the durable JetStream consumer and the inbox's consumer.
const ConsumerName = "loyalty"

// CentsPerPoint is the rate: one point per whole 100 cents (one unit of
// the currency) paid, rounded down, so that a point is never credited for
// money not paid.
const CentsPerPoint = 100

// PointsFor is the points an order of amountCents earns.
func PointsFor(amountCents int64) int64 { return amountCents / CentsPerPoint }

// Balance is a user's points: the mutable row, credited by an atomic
// increment so that concurrent credits of different orders never lose one.
type Balance struct {
	UserID    int64     `gorm:"primaryKey;autoIncrement:false" json:"user_id"`
	Points    int64     `gorm:"not null" json:"points"`
	UpdatedAt time.Time `json:"-"`
}

// TableName keeps the table's name independent of the Go type's.
func (Balance) TableName() string { return "loyalty_balances" }

// Entry is one credit, insert-only, written with the increment. It has no
// unique key on the order or the event on purpose: the ledger records what
// was applied, doubles included, so that the audit can count them.
type Entry struct {
	ID        int64     `gorm:"primaryKey"`
	UserID    int64     `gorm:"not null;index"`
	OrderID   int64     `gorm:"not null;index"`
	EventID   string    `gorm:"size:128;not null"`
	Points    int64     `gorm:"not null"`
	CreatedAt time.Time `gorm:"not null"`
}

// TableName keeps the table's name independent of the Go type's.
func (Entry) TableName() string { return "loyalty_entries" }

// Models are the tables of this package, for migrations.
func Models() []any { return []any{&Balance{}, &Entry{}} }

// Store keeps points in SQL.
type Store struct{ db *gorm.DB }

// NewStore returns a Store on db. Migrate must have run.
func NewStore(db *gorm.DB) *Store { return &Store{db: db} }

// Points reads a user's points; a user never credited has 0.
func (s *Store) Points(ctx context.Context, user int64) (Balance, error) {
	b := Balance{UserID: user}
	err := s.db.WithContext(ctx).Take(&b, user).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return Balance{UserID: user}, nil
	}
	return b, err
}

// credit adds points to user in tx: the ledger row and the increment.
func credit(tx *gorm.DB, e Entry) error {
	if err := tx.Create(&e).Error; err != nil {
		return err
	}
	return tx.Clauses(clause.OnConflict{
		Columns:   []clause.Column{{Name: "user_id"}},
		DoUpdates: clause.Assignments(map[string]any{"points": gorm.Expr("points + ?", e.Points), "updated_at": e.CreatedAt}),
	}).Create(&Balance{UserID: e.UserID, Points: e.Points, UpdatedAt: e.CreatedAt}).Error
}

// Effect credits the points of paid orders: the events.Effect of the
// loyalty consumer.
type Effect struct{}

// Handles is true for order.paid only: placing or cancelling earns nothing.
func (Effect) Handles(typ string) bool { return typ == events.TypeOrderPaid }

// Apply credits the paid order's points to its user, from the order row,
// read in tx (read only): SQLite has one connection, which tx holds.
func (Effect) Apply(ctx context.Context, tx *gorm.DB, e events.Event) error {
	var o order.Order
	err := tx.WithContext(ctx).Take(&o, e.OrderID).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return events.Reject(events.ReasonOrderNotFound, "event %s: no order %d", e.ID, e.OrderID)
	}
	if err != nil {
		return err
	}
	if o.Status != order.StatusPaid {
		return events.Reject(events.ReasonInvalid, "event %s: order %d is %s, not paid", e.ID, o.ID, o.Status)
	}
	return credit(tx, Entry{UserID: o.UserID, OrderID: o.ID, EventID: e.ID, Points: PointsFor(o.AmountCents),
		CreatedAt: time.Now().UTC()})
}

// auditGrace is how long after its payment an order's points may be
// missing before the audit counts them: the consumer is asynchronous, and
// a paid order's event is normally applied well within it.
const auditGrace = time.Minute

// orderPoints is one order's side of the audit: the points it earns if
// paid, and those credited for it.
type orderPoints struct {
	OrderID  int64
	Status   string
	Amount   int64
	PaidAt   *time.Time
	Credited int64
}

// readOrderPoints reads, in one statement, every order that is paid or was
// credited, with its credits. It reads the order domain's table (read
// only): the audit compares the two domains' facts.
func (s *Store) readOrderPoints(ctx context.Context) ([]orderPoints, error) {
	var rows []orderPoints
	err := s.db.WithContext(ctx).Raw(`
		SELECT o.id AS order_id, o.status AS status, o.amount_cents AS amount, o.paid_at AS paid_at,
		       COALESCE(c.points, 0) AS credited
		FROM orders o LEFT JOIN (SELECT order_id, SUM(points) AS points FROM loyalty_entries GROUP BY order_id) c
		     ON c.order_id = o.id
		WHERE o.status = ? OR c.points IS NOT NULL`, order.StatusPaid).Scan(&rows).Error
	return rows, err
}

// Doubled is the audit check: per order, the points credited beyond what
// it earns (a redelivery applied again, or points for an order not paid).
// It is exact at any time: a credit can only follow its payment.
func (s *Store) Doubled(ctx context.Context) (map[string]int64, error) {
	rows, err := s.readOrderPoints(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	for _, r := range rows {
		earned := int64(0)
		if r.Status == order.StatusPaid {
			earned = PointsFor(r.Amount)
		}
		if r.Credited > earned {
			out[strconv.FormatInt(r.OrderID, 10)] = r.Credited - earned
		}
	}
	return out, nil
}

// Missing is the audit check: per order paid more than auditGrace ago, the
// points it earns and was not credited (an event lost, or dead-lettered).
// Orders paid more recently may still be on their way.
func (s *Store) Missing(ctx context.Context) (map[string]int64, error) {
	rows, err := s.readOrderPoints(ctx)
	if err != nil {
		return nil, err
	}
	settled := time.Now().Add(-auditGrace)
	out := map[string]int64{}
	for _, r := range rows {
		if r.Status != order.StatusPaid || r.PaidAt == nil || r.PaidAt.After(settled) {
			continue
		}
		if earned := PointsFor(r.Amount); r.Credited < earned {
			out[strconv.FormatInt(r.OrderID, 10)] = earned - r.Credited
		}
	}
	return out, nil
}

// Reset deletes every balance and credit: no fixture has any.
func (s *Store) Reset(ctx context.Context) error {
	return storage.Conn(ctx, s.db).Transaction(func(tx *gorm.DB) error {
		if err := tx.Where("1 = 1").Delete(&Entry{}).Error; err != nil {
			return err
		}
		if err := tx.Where("1 = 1").Delete(&Balance{}).Error; err != nil {
			return fmt.Errorf("loyalty reset: %w", err)
		}
		return nil
	})
}
