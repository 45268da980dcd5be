package idem

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/storage"
)

// TestASecondRunOfOneKeyCannotCommitItsChange: two runs of one key (the
// first's Redis lease lapsed while it ran) both reach their transaction.
// The first commits its change with the key's record; the second's record
// collides on the primary key, so its transaction, change included, rolls
// back, and it is told ErrKeyTaken (answered 409, whose retry replays).
func TestASecondRunOfOneKeyCannotCommitItsChange(t *testing.T) {
	ctx := context.Background()
	db, err := storage.Open(ctx, storage.Options{SQLitePath: t.TempDir() + "/idem.db"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Migrate(ctx, Models()...); err != nil {
		t.Fatal(err)
	}
	if err := db.Exec("CREATE TABLE moves (id INTEGER PRIMARY KEY AUTOINCREMENT, amount INTEGER)").Error; err != nil {
		t.Fatal(err)
	}
	move := func() error {
		run := keyed.With(ctx, &keyed.Run{User: 1, Key: "k", Fingerprint: "fp"})
		keyed.Decide(run, func(m *map[string]int) keyed.Answer { return keyed.Answer{Status: http.StatusOK, Body: m} })
		keyed.Result(run, &map[string]int{"moved": 250})
		return db.Transaction(func(tx *gorm.DB) error {
			if err := tx.Exec("INSERT INTO moves (amount) VALUES (250)").Error; err != nil {
				return err
			}
			return keyed.Save(run, tx)
		})
	}
	if err := move(); err != nil {
		t.Fatal(err)
	}
	if err := move(); !errors.Is(err, keyed.ErrKeyTaken) {
		t.Fatalf("the second run: %v, want ErrKeyTaken", err)
	}
	var moves int64
	if err := db.Raw("SELECT COUNT(*) FROM moves").Scan(&moves).Error; err != nil || moves != 1 {
		t.Fatalf("%d moves (%v), want 1: the second run's change must roll back", moves, err)
	}
	rec, found, err := (&Idem{o: Options{DB: db.DB}}).lookup(ctx, 1, "k")
	if err != nil || !found || rec.status != http.StatusOK || rec.body != `{"moved":250}` {
		t.Fatalf("record %+v found %v (%v); want the first run's answer", rec, found, err)
	}
}

// TestARecordKeepsTheHeadersItsHandlerAnswersWith: the headers a handler
// makes of its answer (a Location naming the id the insert assigned) are
// recorded with it, so that a replay from the database carries them.
func TestARecordKeepsTheHeadersItsHandlerAnswersWith(t *testing.T) {
	ctx := context.Background()
	db, err := storage.Open(ctx, storage.Options{SQLitePath: t.TempDir() + "/idem.db"})
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := db.Migrate(ctx, Models()...); err != nil {
		t.Fatal(err)
	}
	type placed struct{ ID int64 }
	run := keyed.With(ctx, &keyed.Run{User: 1, Key: "k", Fingerprint: "fp"})
	keyed.Decide(run, func(p *placed) keyed.Answer {
		return keyed.Answer{Status: http.StatusCreated, Body: p, Header: http.Header{"Location": {fmt.Sprintf("/orders/%d", p.ID)}}}
	})
	var p placed
	keyed.Result(run, &p)
	p.ID = 42 // assigned by the insert, before Save
	if err := db.Transaction(func(tx *gorm.DB) error { return keyed.Save(run, tx) }); err != nil {
		t.Fatal(err)
	}
	rec, found, err := (&Idem{o: Options{DB: db.DB}}).lookup(ctx, 1, "k")
	want := `{"Content-Type":"application/json; charset=utf-8","Location":"/orders/42"}`
	if err != nil || !found || rec.header != want {
		t.Fatalf("record headers %s (found %v, %v), want %s", rec.header, found, err, want)
	}
}
