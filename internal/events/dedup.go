package events

import (
	"context"
	"errors"
	"fmt"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
)

// Ways a consumer deduplicates redelivered events, chosen by config
// (SHOP_EVENTS_DEDUP).
const (
	// DedupInbox records (consumer, event id) in the effect's own
	// transaction; a second delivery hits the primary key and rolls back.
	DedupInbox = "inbox"
	// DedupLock takes a lock on the event id, checks a mark, applies and
	// marks: the recipe people copy. It holds only as far as the lock's
	// fence is checked by the store.
	DedupLock = "lock"
	// DedupNone applies every delivery: the baseline that shows the damage.
	DedupNone = "none"
)

// DedupModes are the names SHOP_EVENTS_DEDUP accepts; the first is the default.
var DedupModes = []string{DedupInbox, DedupLock, DedupNone}

// ErrDuplicate: the event was applied already; the delivery is acked and
// nothing changes.
var ErrDuplicate = errors.New("event applied already")

// Dedup runs an event's effect at most once per (consumer, event id), or
// says ErrDuplicate.
type Dedup interface {
	// Apply runs effect in a transaction unless the event was applied
	// already (ErrDuplicate). A returned lockkit.ErrFenced means a newer
	// holder of the event's lock took over: nothing was written.
	Apply(ctx context.Context, consumer, eventID string, effect func(tx *gorm.DB) error) error
}

// InboxEntry is the inbox's record that consumer applied event EventID:
// the primary key is the dedup.
type InboxEntry struct {
	Consumer   string    `gorm:"primaryKey;size:64"`
	EventID    string    `gorm:"primaryKey;size:128"`
	ReceivedAt time.Time `gorm:"not null"`
}

// TableName keeps the table's name independent of the Go type's.
func (InboxEntry) TableName() string { return "event_inbox" }

// EventMark is the lock recipe's "done" record, with the fence of the
// highest lock token that claimed it.
type EventMark struct {
	Consumer string `gorm:"primaryKey;size:64"`
	EventID  string `gorm:"primaryKey;size:128"`
	Fence    uint64 `gorm:"not null;default:0"`
	Done     bool   `gorm:"not null;default:false"`
}

// TableName keeps the table's name independent of the Go type's.
func (EventMark) TableName() string { return "event_marks" }

// DedupOptions select and equip a Dedup.
type DedupOptions struct {
	Mode string // one of DedupModes
	DB   *gorm.DB
	// Locker and LockOptions serve DedupLock; lockkit.WithoutFence in
	// LockOptions gives the unfenced grant whose double the docs show.
	Locker      lockkit.Locker
	LockOptions []lockkit.Option
	// beforeWrite, when set by a test, runs between the check and the
	// write of DedupLock: where a paused consumer sits when its lease and
	// its AckWait run out.
	beforeWrite func(ctx context.Context)
}

// NewDedup returns the Dedup o.Mode names.
func NewDedup(o DedupOptions) (Dedup, error) {
	switch o.Mode {
	case DedupInbox, "":
		return inbox{db: o.DB}, nil
	case DedupNone:
		return noDedup{db: o.DB}, nil
	case DedupLock:
		if o.Locker == nil {
			return nil, errors.New("events: dedup lock needs a Locker")
		}
		return &lockDedup{db: o.DB, locker: o.Locker, opts: o.LockOptions, beforeWrite: o.beforeWrite}, nil
	}
	return nil, fmt.Errorf("events: unknown dedup %q (want one of %v)", o.Mode, DedupModes)
}

type inbox struct{ db *gorm.DB }

// Apply inserts the inbox row first: on MariaDB a concurrent second
// delivery then waits on the key until the first commits, and fails with
// the duplicate; the effect never runs twice.
func (i inbox) Apply(ctx context.Context, consumer, eventID string, effect func(tx *gorm.DB) error) error {
	return i.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		err := tx.Create(&InboxEntry{Consumer: consumer, EventID: eventID, ReceivedAt: time.Now().UTC()}).Error
		if errors.Is(err, gorm.ErrDuplicatedKey) {
			return ErrDuplicate
		}
		if err != nil {
			return err
		}
		return effect(tx)
	})
}

type noDedup struct{ db *gorm.DB }

func (n noDedup) Apply(ctx context.Context, _, _ string, effect func(tx *gorm.DB) error) error {
	return n.db.WithContext(ctx).Transaction(effect)
}

// lockDedup is the recipe "lock the message id, check it was not done,
// apply, mark it done". The mark commits with the effect, so a crash
// between them cannot leave an effect unmarked; what the lock alone cannot
// stop is two holders: one paused past its lease, one granted after. With
// a fencing token the mark row is claimed before the check and the write
// lands only while the row still carries the token, so the paused holder's
// write is refused. Without one (Fence() == 0) both holders saw "not done"
// and both apply.
type lockDedup struct {
	db          *gorm.DB
	locker      lockkit.Locker
	opts        []lockkit.Option
	beforeWrite func(ctx context.Context)
}

func (l *lockDedup) Apply(ctx context.Context, consumer, eventID string, effect func(tx *gorm.DB) error) error {
	key := lockkey.Event.Key(consumer, eventID).String()
	opts := append([]lockkit.Option{lockkit.WithClass(string(lockkey.Event))}, l.opts...)
	return lockkit.Do(ctx, l.locker, key, func(ctx context.Context, fence uint64) error {
		mark := EventMark{Consumer: consumer, EventID: eventID}
		if fence > 0 {
			if err := l.claim(ctx, mark, fence); err != nil {
				return err
			}
		}
		done, err := l.done(ctx, mark)
		if err != nil {
			return err
		}
		if done {
			return ErrDuplicate
		}
		if l.beforeWrite != nil {
			l.beforeWrite(ctx)
		}
		// Detached from the lease: once begun, the transaction commits or
		// rolls back whole, and the fence inside it decides.
		wctx := context.WithoutCancel(ctx)
		return l.db.WithContext(wctx).Transaction(func(tx *gorm.DB) error {
			if err := effect(tx); err != nil {
				return err
			}
			return markDone(tx, mark, fence)
		})
	}, opts...)
}

// claim raises the mark's fence to the token before the check reads it,
// as the account store claims its rows: a newer holder's claim then makes
// every older holder's write miss.
func (l *lockDedup) claim(ctx context.Context, mark EventMark, fence uint64) error {
	db := l.db.WithContext(ctx)
	if err := db.Clauses(clause.OnConflict{DoNothing: true}).Create(&mark).Error; err != nil {
		return err
	}
	res := db.Model(&EventMark{}).Where("consumer = ? AND event_id = ? AND fence < ?", mark.Consumer, mark.EventID, fence).
		Update("fence", fence)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("%w: event %s, token %d", lockkit.ErrFenced, mark.EventID, fence)
	}
	return nil
}

func (l *lockDedup) done(ctx context.Context, mark EventMark) (bool, error) {
	var m EventMark
	err := l.db.WithContext(ctx).Where("consumer = ? AND event_id = ?", mark.Consumer, mark.EventID).Take(&m).Error
	if errors.Is(err, gorm.ErrRecordNotFound) {
		return false, nil
	}
	return m.Done, err
}

// markDone writes the mark in the effect's transaction; with a fence, only
// while the row still carries it, so that a stale holder's effect rolls
// back with its mark.
func markDone(tx *gorm.DB, mark EventMark, fence uint64) error {
	if fence == 0 {
		mark.Done = true
		return tx.Clauses(clause.OnConflict{DoUpdates: clause.Assignments(map[string]any{"done": true})}).Create(&mark).Error
	}
	res := tx.Model(&EventMark{}).Where("consumer = ? AND event_id = ? AND fence = ?", mark.Consumer, mark.EventID, fence).
		Update("done", true)
	if res.Error != nil {
		return res.Error
	}
	if res.RowsAffected == 0 {
		return fmt.Errorf("%w: event %s, token %d", lockkit.ErrFenced, mark.EventID, fence)
	}
	return nil
}
