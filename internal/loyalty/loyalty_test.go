package loyalty

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/gin-gonic/gin"
	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/order"
	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
)

// dialects runs fn on SQLite and on MariaDB.
func dialects(t *testing.T, fn func(t *testing.T, db *gorm.DB)) {
	for _, name := range []string{"sqlite", "mysql"} {
		t.Run(name, func(t *testing.T) {
			o := storage.Options{SQLitePath: t.TempDir() + "/loyalty.db"}
			if name == "mysql" {
				o = storage.Options{MySQLDSN: shoptest.MySQL(t), MaxConns: 4}
			}
			db, err := storage.Open(context.Background(), o)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { db.Close() })
			models := append(append(order.Models(), Models()...), events.ConsumerModels()...)
			if err := db.Migrate(context.Background(), models...); err != nil {
				t.Fatal(err)
			}
			fn(t, db.DB)
		})
	}
}

func placeOrder(t *testing.T, db *gorm.DB, o order.Order) order.Order {
	t.Helper()
	o.IdempotencyKey, o.SKU, o.Quantity = fmt.Sprint("k", o.ID), "sku", 1
	if o.CreatedAt.IsZero() {
		o.CreatedAt = time.Now().UTC()
	}
	if err := db.Create(&o).Error; err != nil {
		t.Fatal(err)
	}
	return o
}

func paidAt(ago time.Duration) *time.Time {
	at := time.Now().UTC().Add(-ago)
	return &at
}

func deliver(t *testing.T, db *gorm.DB, mode string, e events.Event) error {
	t.Helper()
	d, err := events.NewDedup(events.DedupOptions{Mode: mode, DB: db})
	if err != nil {
		t.Fatal(err)
	}
	return d.Apply(context.Background(), ConsumerName, e.ID, func(tx *gorm.DB) error { return Effect{}.Apply(context.Background(), tx, e) })
}

func paidEvent(id int64) events.Event {
	return events.Event{ID: events.ID(id, events.TypeOrderPaid), Type: events.TypeOrderPaid, OrderID: id}
}

func TestPaidOrderCreditsItsUserOnePointPerHundredCentsFromTheOrderRow(t *testing.T) {
	dialects(t, func(t *testing.T, db *gorm.DB) {
		placeOrder(t, db, order.Order{ID: 1, UserID: 7, AmountCents: 1299, Status: order.StatusPaid, PaidAt: paidAt(0)})
		e := paidEvent(1)
		e.UserID, e.AmountCents = 8, 1_000_000 // the event's figures are not trusted
		if err := deliver(t, db, events.DedupInbox, e); err != nil {
			t.Fatal(err)
		}
		s := NewStore(db)
		for user, want := range map[int64]int64{7: 12, 8: 0} {
			b, err := s.Points(context.Background(), user)
			if err != nil {
				t.Fatal(err)
			}
			if b.Points != want {
				t.Fatalf("user %d has %d points, want %d", user, b.Points, want)
			}
		}
	})
}

func TestEventThatCannotApplyIsRejectedAndCreditsNothing(t *testing.T) {
	dialects(t, func(t *testing.T, db *gorm.DB) {
		placeOrder(t, db, order.Order{ID: 2, UserID: 7, AmountCents: 500, Status: order.StatusAwaitingPayment})
		for _, tc := range []struct {
			order  int64
			reason string
		}{{99, events.ReasonOrderNotFound}, {2, events.ReasonInvalid}} {
			err := deliver(t, db, events.DedupInbox, paidEvent(tc.order))
			var r *events.Rejection
			if !errors.As(err, &r) || r.Reason != tc.reason {
				t.Fatalf("order %d: %v, want a rejection %s", tc.order, err, tc.reason)
			}
		}
		var n int64
		db.Model(&Entry{}).Count(&n)
		if n != 0 {
			t.Fatalf("%d credits after rejections, want 0", n)
		}
	})
}

// The audit sees a redelivery applied again (none) as doubled points,
// sees the inbox's second delivery as nothing, and counts a paid order
// without its points as missing only once its grace has passed.
func TestAuditCountsDoubledAndMissingPoints(t *testing.T) {
	dialects(t, func(t *testing.T, db *gorm.DB) {
		placeOrder(t, db, order.Order{ID: 1, UserID: 1, AmountCents: 1000, Status: order.StatusPaid, PaidAt: paidAt(2 * auditGrace)})
		placeOrder(t, db, order.Order{ID: 2, UserID: 1, AmountCents: 2000, Status: order.StatusPaid, PaidAt: paidAt(2 * auditGrace)})
		placeOrder(t, db, order.Order{ID: 3, UserID: 2, AmountCents: 3000, Status: order.StatusPaid, PaidAt: paidAt(2 * auditGrace)})
		placeOrder(t, db, order.Order{ID: 4, UserID: 2, AmountCents: 4000, Status: order.StatusPaid, PaidAt: paidAt(0)})
		for range 2 {
			if err := deliver(t, db, events.DedupNone, paidEvent(1)); err != nil {
				t.Fatal(err)
			}
			if err := deliver(t, db, events.DedupInbox, paidEvent(2)); err != nil && !errors.Is(err, events.ErrDuplicate) {
				t.Fatal(err)
			}
		}
		d := &Domain{Store: NewStore(db), Consumer: events.NewConsumerStore(db)}
		want := map[string]map[string]int64{
			"points_doubled": {"1": 10},
			"points_missing": {"3": 30}, // order 4 was paid within the grace
			"dead_letters":   {},
		}
		for _, c := range d.Checks() {
			got, err := c.Run(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(want[c.Name]) {
				t.Errorf("%s = %v, want %v", c.Name, got, want[c.Name])
			}
		}
		if err := d.Reset(context.Background(), "default"); err != nil {
			t.Fatal(err)
		}
		var left int64
		db.Model(&Balance{}).Count(&left)
		if b, _ := d.Store.Points(context.Background(), 1); b.Points != 0 || left != 0 {
			t.Fatalf("after the reset: user 1 has %d points, %d balances left", b.Points, left)
		}
		// The inbox went with the reset: order ids, and so event ids, may start over.
		if err := deliver(t, db, events.DedupInbox, paidEvent(2)); err != nil {
			t.Fatalf("event after the reset: %v", err)
		}
	})
}

func TestPointsRoute(t *testing.T) {
	dialects(t, func(t *testing.T, db *gorm.DB) {
		placeOrder(t, db, order.Order{ID: 1, UserID: 42, AmountCents: 2550, Status: order.StatusPaid, PaidAt: paidAt(0)})
		if err := deliver(t, db, events.DedupInbox, paidEvent(1)); err != nil {
			t.Fatal(err)
		}
		gin.SetMode(gin.TestMode)
		a := auth.New([]byte("loyalty-test-secret-of-at-least-32-bytes"), "loyalty-admin")
		r := gin.New()
		r.Use(problem.Errors(nil), problem.Recover())
		d := &Domain{Store: NewStore(db), Consumer: events.NewConsumerStore(db)}
		d.Register(r.Group("/api/v1", a.User()), r.Group("/admin/v1", a.Admin()))
		token := func(user int64) string {
			tok, err := a.Token(user, time.Hour, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			return "Bearer " + tok
		}
		for _, tc := range []struct {
			name, path, auth string
			status           int
			want             string
		}{
			{"points-200", "/api/v1/users/42/points", token(42), 200, `{"user_id":42,"points":25}`},
			{"points-none-yet-200", "/api/v1/users/43/points", token(43), 200, `{"user_id":43,"points":0}`},
			{"points-other-user-403", "/api/v1/users/42/points", token(43), 403, `may act only on account 43`},
			{"points-bad-id-400", "/api/v1/users/x/points", token(42), 400, `user id must be a positive integer, got \"x\"`},
			{"points-zero-id-400", "/api/v1/users/0/points", token(42), 400, `positive integer`},
			{"points-anonymous-401", "/api/v1/users/42/points", "", 401, `unauthorized`},
		} {
			t.Run(tc.name, func(t *testing.T) {
				req := httptest.NewRequest("GET", tc.path, nil)
				if tc.auth != "" {
					req.Header.Set("Authorization", tc.auth)
				}
				w := httptest.NewRecorder()
				r.ServeHTTP(w, req)
				if w.Code != tc.status || !strings.Contains(w.Body.String(), tc.want) {
					t.Fatalf("GET %s: %d %s; want %d with %s", tc.path, w.Code, w.Body, tc.status, tc.want)
				}
				if w.Code >= 400 && w.Header().Get("Content-Type") != problem.ContentType {
					t.Fatalf("error with Content-Type %q", w.Header().Get("Content-Type"))
				}
				if !json.Valid(w.Body.Bytes()) {
					t.Fatalf("body is not JSON: %s", w.Body)
				}
			})
		}
	})
}
