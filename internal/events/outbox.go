package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/propagation"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/storage"
)

// OutboxRow is one event as the outbox keeps it, written in the
// transaction of the change it reports. Seq orders the rows: an order's
// later change commits after its earlier one, so its row has a higher Seq.
type OutboxRow struct {
	Seq     int64  `gorm:"primaryKey;autoIncrement"`
	EventID string `gorm:"size:128;not null;uniqueIndex:idx_event_outbox_event_id"`
	OrderID int64  `gorm:"not null;index:idx_event_outbox_order,priority:1"`
	Type    string `gorm:"size:32;not null;index:idx_event_outbox_order,priority:2"`
	// Payload is the message body exactly as it is published, so that a
	// republish sends the same bytes.
	Payload []byte `gorm:"not null"`
	// Traceparent is the W3C trace context of the request that made the
	// change; the relay sends it in the message's headers.
	Traceparent string    `gorm:"size:64;not null;default:''"`
	CreatedAt   time.Time `gorm:"not null"`
	// PublishedAt is set once the broker acknowledged the event; NULL is
	// the backlog.
	PublishedAt *time.Time `gorm:"index:idx_event_outbox_backlog,priority:1"`
}

// TableName is the outbox's table.
func (OutboxRow) TableName() string { return "event_outbox" }

// relayFence is the row that fences the relay's marks: each relay claims
// it with its lease's token, and a mark lands only while the row still
// carries that token.
type relayFence struct {
	Name  string `gorm:"primaryKey;size:32"`
	Fence uint64 `gorm:"not null;default:0"`
	// Marks counts the marks made, so that each mark changes the row: a
	// MySQL UPDATE that changes nothing reports 0 rows, like a refused one.
	Marks int64 `gorm:"not null;default:0"`
}

func (relayFence) TableName() string { return "event_relay" }

const relayName = "relay"

// Models are the outbox's tables, for migrations. Package order includes
// them in its own: its writes need them.
func Models() []any { return []any{&OutboxRow{}, &relayFence{}} }

// Append inserts e into the outbox in tx, the transaction of the change e
// reports, with the trace context of ctx. An event with e's id already
// there is left as it is: the id names what happened, so it is the same
// event (the none lock baseline can decide the same change twice).
func Append(ctx context.Context, tx *gorm.DB, e Event) error {
	payload, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("outbox: encode %s: %w", e.ID, err)
	}
	carrier := propagation.MapCarrier{}
	propagation.TraceContext{}.Inject(ctx, carrier)
	row := OutboxRow{EventID: e.ID, OrderID: e.OrderID, Type: e.Type, Payload: payload,
		Traceparent: carrier.Get("traceparent"), CreatedAt: time.Now().UTC()}
	return tx.Clauses(clause.OnConflict{DoNothing: true}).Create(&row).Error
}

// Outbox reads and marks the rows Append wrote.
type Outbox struct{ db *gorm.DB }

// NewOutbox returns the outbox on db, migrated with Models.
func NewOutbox(db *gorm.DB) *Outbox { return &Outbox{db: db} }

// Unpublished returns up to limit rows not yet published, oldest first,
// at most one per order: an order's later event waits until its earlier
// one is marked, so that a failure between them cannot reorder them.
func (o *Outbox) Unpublished(ctx context.Context, limit int) ([]OutboxRow, error) {
	var rows []OutboxRow
	// Read more than limit: rows of the same order are dropped below.
	err := o.db.WithContext(ctx).Where("published_at IS NULL").Order("seq").Limit(2 * limit).Find(&rows).Error
	if err != nil {
		return nil, err
	}
	seen := make(map[int64]bool, len(rows))
	out := rows[:0]
	for _, r := range rows {
		if seen[r.OrderID] || len(out) == limit {
			seen[r.OrderID] = true
			continue
		}
		seen[r.OrderID] = true
		out = append(out, r)
	}
	return out, nil
}

// Claim raises the relay's fence to the token of the lease just granted;
// a newer relay having claimed a higher one refuses it with
// lockkit.ErrFenced. 0 claims nothing (a backend that cannot fence).
func (o *Outbox) Claim(ctx context.Context, fence uint64) error {
	if fence == 0 {
		return nil
	}
	db := o.db.WithContext(ctx)
	if err := db.Clauses(clause.OnConflict{DoNothing: true}).Create(&relayFence{Name: relayName}).Error; err != nil {
		return err
	}
	res := db.Exec("UPDATE event_relay SET fence = ? WHERE name = ? AND fence < ?", fence, relayName, fence)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("%w: relay token %d", lockkit.ErrFenced, fence)
	}
	return nil
}

// MarkPublished marks the rows seqs published, in one transaction that
// lands only while the relay's fence is still fence: a relay whose lease
// was taken over gets lockkit.ErrFenced and marks nothing. 0 marks
// unfenced.
func (o *Outbox) MarkPublished(ctx context.Context, fence uint64, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	return o.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if fence != 0 {
			// Locks the fence row until commit: a claim by a newer relay
			// waits for this mark, or this mark sees the newer token.
			res := tx.Exec("UPDATE event_relay SET marks = marks + 1 WHERE name = ? AND fence = ?", relayName, fence)
			if res.Error != nil {
				return res.Error
			}
			if res.RowsAffected == 0 {
				return fmt.Errorf("%w: relay token %d", lockkit.ErrFenced, fence)
			}
		}
		return tx.Model(&OutboxRow{}).Where("seq IN ? AND published_at IS NULL", seqs).
			Update("published_at", time.Now().UTC()).Error
	})
}

// Backlog is the outbox's unpublished rows: how many, and since when.
type Backlog struct {
	Rows   int64
	Oldest time.Time // zero when Rows is 0
}

// Backlog reads the backlog in one statement.
func (o *Outbox) Backlog(ctx context.Context) (Backlog, error) {
	var r struct {
		N      int64
		Oldest *string
	}
	// MIN of a time column comes back as text from SQLite: parsed below.
	err := o.db.WithContext(ctx).Raw("SELECT COUNT(*) AS n, MIN(created_at) AS oldest FROM event_outbox WHERE published_at IS NULL").
		Scan(&r).Error
	if err != nil {
		return Backlog{}, err
	}
	b := Backlog{Rows: r.N}
	if r.Oldest != nil {
		b.Oldest, err = parseDBTime(*r.Oldest)
	}
	return b, err
}

func parseDBTime(s string) (time.Time, error) {
	for _, layout := range []string{"2006-01-02 15:04:05.999999999-07:00", "2006-01-02 15:04:05.999999999", time.RFC3339Nano} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, fmt.Errorf("outbox: unreadable time %q", s)
}

// Reset deletes every outbox row (the reset's fixtures have no orders).
// The relay's fence stays: a relay granted before the reset is still
// refused once a newer one claimed.
func (o *Outbox) Reset(ctx context.Context) error {
	return storage.Conn(ctx, o.db).Where("1 = 1").Delete(&OutboxRow{}).Error
}

// ErrNotRecorded is returned for an event id the outbox does not hold.
var ErrNotRecorded = errors.New("event not in the outbox")

// Row reads the outbox row of event id.
func (o *Outbox) Row(ctx context.Context, id string) (OutboxRow, error) {
	var r OutboxRow
	err := o.db.WithContext(ctx).Where("event_id = ?", id).Take(&r).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return r, fmt.Errorf("%w: %s", ErrNotRecorded, id)
	}
	return r, err
}
