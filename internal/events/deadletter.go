package events

import (
	"context"
	"errors"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/storage"
)

// Reasons a message is dead-lettered. They label metrics and the audit:
// keep them few and fixed.
const (
	// ReasonUndecodable: the payload is not an Event in JSON.
	ReasonUndecodable = "undecodable"
	// ReasonUnknownType: the event's type is none of the order types.
	ReasonUnknownType = "unknown-type"
	// ReasonInvalid: the event names no order, or contradicts the order it
	// names (the effect's own verdict).
	ReasonInvalid = "invalid"
	// ReasonOrderNotFound: the event names an order that does not exist.
	ReasonOrderNotFound = "order-not-found"
	// ReasonMaxDeliveries: the effect failed on every one of MaxDeliver
	// deliveries.
	ReasonMaxDeliveries = "max-deliveries"
)

// Rejection is an effect's verdict that an event can never apply: it is
// dead-lettered at once, not retried.
type Rejection struct {
	Reason string // one of the Reason* constants
	Detail string
}

func (r *Rejection) Error() string { return r.Reason + ": " + r.Detail }

// Reject returns the Rejection of an event for reason.
func Reject(reason, format string, args ...any) error {
	return rejection(reason, format, args...)
}

// DeadLetter is a message the consumer gave up on, with why. The payload
// is kept (truncated) so that an operator can see and replay it.
type DeadLetter struct {
	ID         int64     `gorm:"primaryKey" json:"id"`
	Consumer   string    `gorm:"size:64;not null;index" json:"consumer"`
	EventID    string    `gorm:"size:128;not null" json:"event_id"`
	Subject    string    `gorm:"size:255;not null" json:"subject"`
	StreamSeq  uint64    `gorm:"not null" json:"stream_seq"`
	Deliveries uint64    `gorm:"not null" json:"deliveries"`
	Reason     string    `gorm:"size:32;not null" json:"reason"`
	Detail     string    `gorm:"size:1024;not null" json:"detail"`
	Payload    string    `gorm:"type:text;not null" json:"payload"`
	CreatedAt  time.Time `gorm:"not null" json:"created_at"`
}

// TableName keeps the table's name independent of the Go type's.
func (DeadLetter) TableName() string { return "event_dead_letters" }

// maxKeptPayload bounds a dead letter's payload: a poison message may be
// large, and the row only has to let someone see what it was.
const maxKeptPayload = 4 << 10

// ConsumerModels are the consumer's tables, for migrations.
func ConsumerModels() []any { return []any{&InboxEntry{}, &EventMark{}, &DeadLetter{}} }

// ConsumerStore keeps the consumer's records: inbox, marks, dead letters.
type ConsumerStore struct{ db *gorm.DB }

// NewConsumerStore returns the store on db.
func NewConsumerStore(db *gorm.DB) *ConsumerStore { return &ConsumerStore{db: db} }

func (s *ConsumerStore) addDeadLetter(ctx context.Context, d DeadLetter) error {
	if len(d.Payload) > maxKeptPayload {
		d.Payload = d.Payload[:maxKeptPayload]
	}
	if len(d.Detail) > 1024 {
		d.Detail = d.Detail[:1024]
	}
	if len(d.EventID) > 128 {
		d.EventID = d.EventID[:128]
	}
	d.CreatedAt = time.Now().UTC()
	return s.db.WithContext(ctx).Create(&d).Error
}

// DeadLetters is the audit check: dead letters by reason. Every one is a
// message whose effect did not happen.
func (s *ConsumerStore) DeadLetters(ctx context.Context) (map[string]int64, error) {
	var rows []struct {
		Reason string
		N      int64
	}
	err := s.db.WithContext(ctx).Model(&DeadLetter{}).Select("reason, COUNT(*) AS n").Group("reason").Scan(&rows).Error
	out := make(map[string]int64, len(rows))
	for _, r := range rows {
		out[r.Reason] = r.N
	}
	return out, err
}

// ListDeadLetters returns the newest dead letters first, at most limit.
func (s *ConsumerStore) ListDeadLetters(ctx context.Context, limit int) ([]DeadLetter, error) {
	var out []DeadLetter
	err := s.db.WithContext(ctx).Order("id DESC").Limit(limit).Find(&out).Error
	return out, err
}

// Reset empties the inbox and the dead letters and clears the marks'
// "done", keeping their fences: a lock holder from before the reset must
// still be refused. Order ids may start over after the orders' reset, and
// so may event ids: an inbox kept would swallow the new events.
func (s *ConsumerStore) Reset(ctx context.Context) error {
	return storage.Conn(ctx, s.db).Transaction(func(tx *gorm.DB) error {
		return errors.Join(
			tx.Where("1 = 1").Delete(&InboxEntry{}).Error,
			tx.Where("1 = 1").Delete(&DeadLetter{}).Error,
			tx.Model(&EventMark{}).Where("done = ?", true).Update("done", false).Error,
		)
	})
}

// ForgetFences sets every mark's fence to 0 (see cmd/shop's forgetFences).
func (s *ConsumerStore) ForgetFences(ctx context.Context) error {
	return s.db.WithContext(ctx).Model(&EventMark{}).Where("fence <> 0").Update("fence", 0).Error
}
