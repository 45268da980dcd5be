package storage

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/lockkit"
)

// Fenced is a table whose rows carry the fencing token of the last lock
// holder that claimed them (column fence), written claim-then-fenced-write:
//
//  1. Claim raises the row's fence to the holder's token before the holder
//     reads the row, refusing a token that does not beat the fence (an
//     older holder's, or one that claimed the row already). So a token
//     claims a row at most once, and as nothing retries a write under one
//     grant, it writes the row at most once.
//  2. Update writes the row only while its fence is still that token: no
//     newer holder has claimed it since this one read it.
//
// The claim comes before the read because a fence checked only at write
// time lets a lost update through: a stale holder that read and stalled,
// and a new holder that read the same row before the stale write landed,
// would both pass "fence < token" in turn, and the newer write would
// overwrite the stale one from a stale read. Claiming first shows the
// store the newer token before its holder reads, so every older write
// that lands later is refused, and every older write that landed earlier
// is in what the newer holder reads. A token of 0 (a backend that cannot
// fence, or none) claims nothing and writes unchecked: that is
// what lets the none baseline lose updates.
type Fenced struct {
	Table string // accounts, products, orders
	Key   string // the key column: id, sku
	Noun  string // a row's name in errors: account, product, order
	// NotFound is the store's error for a row that is not there.
	NotFound error
}

// Claim raises row id's fence to token; 0 claims nothing. It returns
// NotFound, or lockkit.ErrFenced when the row's fence is token or newer.
func (f Fenced) Claim(ctx context.Context, db *gorm.DB, id any, token uint64) error {
	if token == 0 {
		return nil
	}
	res := db.WithContext(ctx).Exec("UPDATE "+f.Table+" SET fence = ? WHERE "+f.Key+" = ? AND fence < ?", token, id, token)
	switch {
	case res.Error != nil:
		return res.Error
	case res.RowsAffected > 0:
		return nil
	}
	var rows int64
	if err := db.WithContext(ctx).Table(f.Table).Where(f.Key+" = ?", id).Count(&rows).Error; err != nil {
		return err
	}
	if rows == 0 {
		return fmt.Errorf("%w: no %s", f.NotFound, f.row(id))
	}
	return f.Refused(id, token)
}

// Change is one fenced write: Set's assignments, on a row that also meets
// Guard (a condition of the write's own, a version or a balance; "" for
// none). Args fill Set's placeholders, then Guard's.
type Change struct {
	Set   string
	Guard string
	Args  []any
}

// Update makes change c to row id in tx while the row's fence is token
// (0: unchecked), and reports whether it did: when not, the caller reads
// the row to tell why (Refused, when its fence moved on).
func (f Fenced) Update(tx *gorm.DB, id any, token uint64, c Change) (bool, error) {
	var where []string
	if c.Guard != "" {
		where = append(where, c.Guard)
	}
	where = append(where, f.Key+" = ?")
	args := append(c.Args[:len(c.Args):len(c.Args)], id)
	if token != 0 {
		where = append(where, "fence = ?")
		args = append(args, token)
	}
	res := tx.Exec("UPDATE "+f.Table+" SET "+c.Set+" WHERE "+strings.Join(where, " AND "), args...)
	return res.RowsAffected > 0, res.Error
}

// Refused is the error of a write whose token lost row id to a newer one.
func (f Fenced) Refused(id any, token uint64) error {
	return fmt.Errorf("%w: %s, token %d", lockkit.ErrFenced, f.row(id), token)
}

func (f Fenced) row(id any) string {
	if s, ok := id.(string); ok {
		return f.Noun + " " + strconv.Quote(s)
	}
	return fmt.Sprintf("%s %v", f.Noun, id)
}
