package idem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"gorm.io/gorm"
)

// Record is a keyed request's answer, kept in the database of its effect
// and inserted in the effect's own transaction (Stripe's "atomic phase"):
// the change and the proof that it happened commit together or not at
// all. Its primary key is the user and the key, so a second run of one key
// cannot insert it again: its transaction fails and rolls its change back.
// Redis keeps the in-flight lease and a copy of the answer; this row is
// what a retry finds when the commit's reply was lost or Redis forgot.
type Record struct {
	UserID      int64     `gorm:"primaryKey;autoIncrement:false"`
	KeyHash     string    `gorm:"primaryKey;size:32"` // the key's sha256, as Redis names it
	Fingerprint string    `gorm:"size:64;not null"`
	Status      int       `gorm:"not null"`
	Header      string    `gorm:"size:1024;not null"` // JSON of the stored headers
	Body        string    `gorm:"type:mediumtext;not null"`
	RequestID   string    `gorm:"size:64;not null;default:''"`
	CreatedAt   time.Time `gorm:"index"` // the pruner's order
}

// TableName keeps the table's name independent of the type's.
func (Record) TableName() string { return "idempotency_records" }

// Models are the tables of this package, for migrations.
func Models() []any { return []any{&Record{}} }

// ErrKeyTaken is Save's refusal: another run of the same key recorded
// its change first. It is also answered 409 idempotency-key-in-use.
var ErrKeyTaken = errors.New("(the key was recorded by another run)")

// jsonContentType is the Content-Type gin's c.JSON sends, which a replay
// of a recorded answer sends again.
const jsonContentType = "application/json; charset=utf-8"

// attempt is a keyed request that runs, as its context carries it to the
// store that writes its effect.
type attempt struct {
	user            int64
	key, fp, rid    string
	status          int
	answer          any
	header          func(answer any) http.Header
	recorded, taken bool
}

type attemptKey struct{}

func withAttempt(ctx context.Context, a *attempt) context.Context {
	return context.WithValue(ctx, attemptKey{}, a)
}

func attemptOf(ctx context.Context) *attempt {
	a, _ := ctx.Value(attemptKey{}).(*attempt)
	return a
}

// Answer tells the keyed request ctx carries, if any, what its handler
// will answer when its change commits: status and v as JSON. v may be a
// pointer to a value the change fills in (an id the insert assigns): it is
// encoded when Save records it.
func Answer(ctx context.Context, status int, v any) {
	if a := attemptOf(ctx); a != nil {
		a.status, a.answer = status, v
	}
}

// HeaderFor tells the keyed request ctx carries, if any, the headers its
// handler will answer with besides Content-Type, made from the answer
// (the *T given to Answer) when Save records it: a Location naming the id
// the insert assigned is known only then. The handler sends header(answer)
// itself, so that the recorded answer is the one the client got.
func HeaderFor[T any](ctx context.Context, header func(*T) http.Header) {
	if a := attemptOf(ctx); a != nil {
		a.header = func(answer any) http.Header {
			if v, ok := answer.(*T); ok {
				return header(v)
			}
			return nil
		}
	}
}

// Save inserts, in the transaction tx of the change, the record of the
// keyed request ctx carries, with the answer given to Answer and the
// headers HeaderFor makes of it. Without a key, or without an answer, it
// does nothing. Stores call it last in the transaction that writes the
// change.
//
// If the key was recorded already (another run of the same key, whose
// lease in Redis lapsed, committed first), Save fails with 409
// idempotency-key-in-use and the caller's transaction must roll back: the
// change is not made twice, and the retry the 409 asks for replays the
// first answer.
func Save(ctx context.Context, tx *gorm.DB) error {
	a := attemptOf(ctx)
	if a == nil || a.answer == nil {
		return nil
	}
	body, err := json.Marshal(a.answer)
	if err != nil {
		return fmt.Errorf("idem: encode the answer: %w", err)
	}
	header := http.Header{"Content-Type": {jsonContentType}}
	if a.header != nil {
		maps.Copy(header, a.header(a.answer))
	}
	rec := Record{UserID: a.user, KeyHash: recordName(a.key), Fingerprint: a.fp, Status: a.status,
		Header: storedHeaderJSON(header), Body: string(body), RequestID: a.rid}
	err = tx.Create(&rec).Error
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		a.taken = true
		return fmt.Errorf("%w %w", inUseError(), ErrKeyTaken)
	}
	if err == nil {
		a.recorded = true
	}
	return err
}

// lookup reads the record of user's key from the database: what a
// request finds when Redis has no answer for it.
func (m *Idem) lookup(ctx context.Context, user int64, key string) (record, bool, error) {
	if m.o.DB == nil {
		return record{}, false, nil
	}
	var rows []Record
	err := m.o.DB.WithContext(ctx).Where("user_id = ? AND key_hash = ?", user, recordName(key)).Limit(1).Find(&rows).Error
	if err != nil || len(rows) == 0 {
		return record{}, false, err
	}
	r := rows[0]
	return record{fp: r.Fingerprint, status: r.Status, header: r.Header, body: r.Body, rid: r.RequestID}, true, nil
}
