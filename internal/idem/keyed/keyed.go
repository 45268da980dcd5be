// Package keyed records the answer of a request sent with an
// Idempotency-Key in the transaction of the change it makes, so that the
// change and the proof that it happened commit together or not at all
// (Stripe's "atomic phase"). Package idem's middleware starts each keyed
// run; this package is what the layers under it see, and it knows no HTTP
// framework:
//
//   - the handler decides the answer, status, headers and body, from the
//     result of the change (Decide), and sends the same answer itself;
//   - the service names the value its change produces (Result), which the
//     store's write may fill in (an id the insert assigns);
//   - the store calls Save last in the change's transaction.
//
// A request without a key carries no Run, and all three do nothing.
package keyed

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"time"

	"gorm.io/gorm"
)

// Record is a keyed request's answer, kept in the database of its effect
// and inserted in the effect's own transaction. Its primary key is the
// user and the key, so a second run of one key cannot insert it again: its
// transaction fails and rolls its change back. Redis keeps the in-flight
// lease and a copy of the answer; this row is what a retry finds when the
// commit's reply was lost or Redis forgot.
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

// KeyHash is how a record (and Redis) names a key: the key itself may hold
// any character, braces included.
func KeyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// ErrKeyTaken is Save's refusal: another run of the same key recorded its
// change first. idem's problem row answers it 409 idempotency-key-in-use,
// whose retry replays the first run's answer.
var ErrKeyTaken = errors.New("another run of this Idempotency-Key recorded its change first")

// StoredHeaders are the response headers a record keeps and a replay
// sends again. Others (Date, X-Request-Id, Retry-After) belong to the
// answer they were sent with.
var StoredHeaders = []string{"Content-Type", "Location", "Cache-Control"}

// HeaderJSON is the JSON of h's StoredHeaders, as a record keeps them.
func HeaderJSON(h http.Header) string {
	kept := map[string]string{}
	for _, name := range StoredHeaders {
		if v := h.Get(name); v != "" {
			kept[name] = v
		}
	}
	j, _ := json.Marshal(kept) // a map of strings always encodes
	return string(j)
}

// jsonContentType is the Content-Type gin's c.JSON sends, which a replay
// of a recorded answer sends again.
const jsonContentType = "application/json; charset=utf-8"

// Answer is what a keyed request answers once its change commits.
type Answer struct {
	Status int
	Header http.Header // besides Content-Type
	Body   any         // sent as JSON
}

// Run is one keyed request while it runs.
type Run struct {
	User                        int64
	Key, Fingerprint, RequestID string
	// Taken: another run of the key recorded its change first (Save).
	Taken bool

	answer func(result any) (Answer, bool)
	result any
}

type runKey struct{}

// With returns ctx carrying run, down to the store that records it.
func With(ctx context.Context, run *Run) context.Context {
	return context.WithValue(ctx, runKey{}, run)
}

func from(ctx context.Context) *Run {
	run, _ := ctx.Value(runKey{}).(*Run)
	return run
}

// Decide tells the keyed run ctx carries, if any, how its handler answers
// a change whose result is a *T: what Save records, and what the handler
// sends.
func Decide[T any](ctx context.Context, answer func(*T) Answer) {
	if run := from(ctx); run != nil {
		run.answer = func(result any) (Answer, bool) {
			v, ok := result.(*T)
			if !ok {
				return Answer{}, false
			}
			return answer(v), true
		}
	}
}

// Result names, for the keyed run ctx carries, the value its change
// produces: a pointer the change may still fill in before Save.
func Result(ctx context.Context, v any) {
	if run := from(ctx); run != nil {
		run.result = v
	}
}

// Save inserts, in the transaction tx of the change, the record of the
// keyed run ctx carries: the answer its handler makes of its result.
// Without a run, an answer or a result, it does nothing. Stores call it
// last in the transaction that writes the change.
//
// If the key was recorded already (another run of the same key, whose
// lease in Redis lapsed, committed first), Save fails with ErrKeyTaken and
// the caller's transaction must roll back: the change is not made twice.
func Save(ctx context.Context, tx *gorm.DB) error {
	run := from(ctx)
	if run == nil || run.answer == nil || run.result == nil {
		return nil
	}
	a, ok := run.answer(run.result)
	if !ok {
		return nil
	}
	body, err := json.Marshal(a.Body)
	if err != nil {
		return fmt.Errorf("idem: encode the answer: %w", err)
	}
	header := http.Header{"Content-Type": {jsonContentType}}
	maps.Copy(header, a.Header)
	rec := Record{UserID: run.User, KeyHash: KeyHash(run.Key), Fingerprint: run.Fingerprint, Status: a.Status,
		Header: HeaderJSON(header), Body: string(body), RequestID: run.RequestID}
	err = tx.Create(&rec).Error
	if errors.Is(err, gorm.ErrDuplicatedKey) {
		run.Taken = true
		return ErrKeyTaken
	}
	return err
}
