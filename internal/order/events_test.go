package order

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/events"
)

// outbox returns the outbox rows in the order they were written.
func (s *shop) outbox() []events.OutboxRow {
	s.t.Helper()
	var rows []events.OutboxRow
	if err := s.db.Order("seq").Find(&rows).Error; err != nil {
		s.t.Fatal(err)
	}
	return rows
}

// Placed, paid at once, paid later, and cancelled by the closer: each
// change leaves its event in the outbox, with the id derived from what
// happened and the order as it stood after the change.
func TestEveryOrderChangeWritesItsEvent(t *testing.T) {
	const payTimeout = time.Hour
	s := newShop(t, Options{PayTimeout: payTimeout})
	ctx := context.Background()
	later, _, err := s.service.Place(ctx, user, "k-later", "widget", 1, false)
	if err != nil {
		t.Fatal(err)
	}
	atOnce, _, err := s.service.Place(ctx, user, "k-at-once", "widget", 2, true)
	if err != nil {
		t.Fatal(err)
	}
	unpaid, _, err := s.service.Place(ctx, user, "k-unpaid", "widget", 3, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.service.Pay(ctx, user, later.ID); err != nil {
		t.Fatal(err)
	}
	aged := unpaid.CreatedAt.Add(-payTimeout - time.Second)
	if err := s.db.Exec("UPDATE orders SET created_at = ? WHERE id = ?", aged, unpaid.ID).Error; err != nil {
		t.Fatal(err)
	}
	if n, err := s.service.CloseExpired(ctx, slog.Default()); n != 1 || err != nil {
		t.Fatalf("closed %d, %v", n, err)
	}
	want := []struct {
		order    Order
		typ      string
		quantity int64
	}{
		{later, events.TypeOrderPlaced, 1},
		{atOnce, events.TypeOrderPlaced, 2},
		{atOnce, events.TypeOrderPaid, 2},
		{unpaid, events.TypeOrderPlaced, 3},
		{later, events.TypeOrderPaid, 1},
		{unpaid, events.TypeOrderCancelled, 3},
	}
	rows := s.outbox()
	if len(rows) != len(want) {
		t.Fatalf("%d outbox rows, want %d: %+v", len(rows), len(want), rows)
	}
	for i, w := range want {
		r := rows[i]
		var e events.Event
		if err := json.Unmarshal(r.Payload, &e); err != nil {
			t.Fatal(err)
		}
		id := events.ID(w.order.ID, w.typ)
		if r.EventID != id || e.ID != id || e.Type != w.typ || e.OrderID != w.order.ID || e.UserID != user ||
			e.Quantity != w.quantity || e.AmountCents != w.quantity*price || e.SKU != "widget" || r.PublishedAt != nil {
			t.Errorf("row %d: %+v, event %+v; want %s", i, r, e, id)
		}
	}
	s.auditOK()
}

// A change refused inside its transaction (here: its stock row taken by a
// newer lock holder) leaves no event: the event commits with the change or
// not at all.
func TestRefusedChangeLeavesNoEvent(t *testing.T) {
	ctx := context.Background()
	s := newShop(t, Options{})
	o, _, err := s.service.Place(ctx, user, "k", "widget", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	s.orders.beforeWrite = func(context.Context) {
		if err := s.accounts.Claim(ctx, user, 11); err != nil {
			t.Error(err)
		}
	}
	if _, err := s.orders.Update(ctx, o.ID, Fences{Order: 10, Account: 10}, func(_ context.Context, o *Order) error {
		return o.pay(now())
	}); err == nil {
		t.Fatal("a stale pay committed")
	}
	if rows := s.outbox(); len(rows) != 1 || rows[0].Type != events.TypeOrderPlaced {
		t.Fatalf("outbox after a refused pay: %+v", rows)
	}
}

// The audit counts the events of committed changes that were never
// published, once they are older than the bound: here the outbox rows of
// one order are marked published and the other's are left, aged.
func TestAuditCountsEventsNeverPublished(t *testing.T) {
	ctx := context.Background()
	s := newShop(t, Options{UnpublishedAfter: time.Minute})
	published, _, err := s.service.Place(ctx, user, "k-1", "widget", 1, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.service.Place(ctx, user, "k-2", "widget", 1, true); err != nil {
		t.Fatal(err)
	}
	if got := s.audit().Drifts["unpublished_order_events"].Total; got != 0 {
		t.Fatalf("young events counted as unpublished: %d", got)
	}
	if err := s.db.Exec("UPDATE event_outbox SET published_at = ? WHERE order_id = ?", time.Now().UTC(), published.ID).Error; err != nil {
		t.Fatal(err)
	}
	if err := s.db.Exec("UPDATE event_outbox SET created_at = ?", time.Now().UTC().Add(-2*time.Minute)).Error; err != nil {
		t.Fatal(err)
	}
	d := s.audit().Drifts["unpublished_order_events"]
	if d.Total != 2 || d.By[events.TypeOrderPlaced] != 1 || d.By[events.TypeOrderPaid] != 1 {
		t.Fatalf("unpublished_order_events %+v, want placed 1 and paid 1", d)
	}
}

// The pay deadline is the contract: a pay after it is refused with 409
// payment-too-late even though no closer has run, and the order ends
// cancelled, its stock returned and its order.cancelled event written;
// never paid.
func TestPayAfterTheDeadlineIsRefusedAndCancelsTheOrder(t *testing.T) {
	const payTimeout = time.Hour
	s := newShop(t, Options{PayTimeout: payTimeout})
	ctx := context.Background()
	o, _, err := s.service.Place(ctx, user, "k-late", "widget", 2, false)
	if err != nil {
		t.Fatal(err)
	}
	aged := o.CreatedAt.Add(-payTimeout - time.Second)
	if err := s.db.Exec("UPDATE orders SET created_at = ? WHERE id = ?", aged, o.ID).Error; err != nil {
		t.Fatal(err)
	}
	w := s.do("POST", "/api/v1/orders/"+jsonID(o)+"/pay", user, "", "")
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "payment-too-late") {
		t.Fatalf("late pay: %d %s; want 409 payment-too-late", w.Code, w.Body)
	}
	if _, err := s.service.Pay(ctx, user, o.ID); !errors.Is(err, ErrPaymentTooLate) && !errors.Is(err, ErrCancelled) {
		t.Fatalf("pay again: %v", err)
	}
	got, err := s.service.Get(ctx, user, o.ID)
	if err != nil || got.Status != StatusCancelled {
		t.Fatalf("order after a late pay: %+v, %v; want cancelled", got, err)
	}
	if st := s.state(); st.debits != 0 || st.returns != 1 || st.balance != opening || st.stock != stock {
		t.Fatalf("after a late pay: %+v", st)
	}
	var types []string
	for _, r := range s.outbox() {
		types = append(types, r.Type)
	}
	if fmt.Sprint(types) != fmt.Sprint([]string{events.TypeOrderPlaced, events.TypeOrderCancelled}) {
		t.Fatalf("events %v; want placed, cancelled", types)
	}
	if n, err := s.service.CloseExpired(ctx, slog.Default()); n != 0 || err != nil {
		t.Fatalf("the closer cancelled again: %d, %v", n, err)
	}
	s.auditOK()
}

// The reset deletes the outbox with the orders: an event of an order that
// no longer exists must not be published after it.
func TestResetEmptiesTheOutbox(t *testing.T) {
	s := newShop(t, Options{})
	if _, _, err := s.service.Place(context.Background(), user, "k", "widget", 1, true); err != nil {
		t.Fatal(err)
	}
	if err := s.domain.Reset(context.Background(), "default"); err != nil {
		t.Fatal(err)
	}
	if rows := s.outbox(); len(rows) != 0 {
		t.Fatalf("outbox after the reset: %+v", rows)
	}
}
