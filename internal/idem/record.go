package idem

import (
	"context"
	"maps"
	"net/http"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/problem"
)

// Models are the tables of this package, for migrations.
func Models() []any { return keyed.Models() }

// Problems are idem's rows of the API's problem table: a second run of
// one key whose change the first run's record refused (keyed.Save).
func Problems() []problem.Mapping {
	return []problem.Mapping{{Target: keyed.ErrKeyTaken, Status: http.StatusConflict, Slug: "idempotency-key-in-use",
		Title: "Idempotency-Key in use", Detail: inUseDetail, RetryAfter: 1}}
}

// Reply sends answer a: the one a keyed change's record holds (keyed.Decide).
func Reply(c *gin.Context, a keyed.Answer) {
	maps.Copy(c.Writer.Header(), a.Header)
	c.JSON(a.Status, a.Body)
}

// lookup reads the record of user's key from the database: what a
// request finds when Redis has no answer for it.
func (m *Idem) lookup(ctx context.Context, user int64, key string) (record, bool, error) {
	if m.o.DB == nil {
		return record{}, false, nil
	}
	var rows []keyed.Record
	err := m.o.DB.WithContext(ctx).Where("user_id = ? AND key_hash = ?", user, keyed.KeyHash(key)).Limit(1).Find(&rows).Error
	if err != nil || len(rows) == 0 {
		return record{}, false, err
	}
	r := rows[0]
	return record{fp: r.Fingerprint, status: r.Status, header: r.Header, body: r.Body, rid: r.RequestID}, true, nil
}
