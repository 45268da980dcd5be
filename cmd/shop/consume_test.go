package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/testenv"
)

// shop serve runs the loyalty consumer: a paid order's event credits its
// user's points once, a second copy of the event (a redelivery) credits
// nothing, and the audit stays clean.
func TestServeConsumesPaidOrdersIntoPointsOnce(t *testing.T) {
	broker := testenv.StartNATS(t)
	srv, _ := newTestServer(t, map[string]string{"SHOP_NATS_URL": broker.URL(), "SHOP_EVENTS_ACK_WAIT": "2s"})
	c := newContract(t, srv.URL)
	u1 := tokens(t)["user1"]
	nc, err := nats.Connect(broker.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := events.EnsureStream(ctx, js, events.StreamOptions{Replicas: 1, DuplicateWindow: events.DefaultDuplicateWindow,
		MaxAge: events.DefaultMaxAge}); err != nil {
		t.Fatal(err)
	}

	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/reset", token: testAdmin, status: 200})
	var tok struct{ Token string }
	_ = json.Unmarshal(c.run(t, srv, apiCase{method: "POST", path: "/api/v1/idempotency-tokens", token: u1, status: 201}), &tok)
	var placed struct {
		ID          int64
		AmountCents int64 `json:"amount_cents"`
	}
	_ = json.Unmarshal(c.run(t, srv, apiCase{method: "POST", path: "/api/v1/orders", token: u1,
		body: `{"sku":"phone-x","quantity":2,"pay":true}`, header: map[string]string{"Idempotency-Key": tok.Token}, status: 201}), &placed)

	// As the relay publishes it (the broker drops it if the relay did already),
	// then a second copy without a message id, as a republish past the
	// duplicate window leaves it.
	e := events.Event{ID: events.ID(placed.ID, events.TypeOrderPaid), Type: events.TypeOrderPaid, OrderID: placed.ID, UserID: 1,
		SKU: "phone-x", Quantity: 2, AmountCents: placed.AmountCents, OccurredAt: time.Now().UTC()}
	b, _ := json.Marshal(e)
	if _, err := js.Publish(ctx, e.Subject(), b, jetstream.WithMsgID(e.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, e.Subject(), b); err != nil {
		t.Fatal(err)
	}
	want := placed.AmountCents / 100
	deadline := time.Now().Add(30 * time.Second)
	for {
		var p struct{ Points int64 }
		_ = json.Unmarshal(c.run(t, srv, apiCase{method: "GET", path: "/api/v1/users/1/points", token: u1, status: 200}), &p)
		metrics := getOK(t, srv, "/metrics", "")
		if p.Points == want && strings.Contains(metrics, `shop_consumer_duplicates_total{consumer="loyalty"} 1`) {
			break
		}
		if p.Points > want || time.Now().After(deadline) {
			t.Fatalf("user 1 has %d points, want %d once both copies are consumed; metrics:\n%s", p.Points, want,
				grep(metrics, "shop_consumer_"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	audit := getOK(t, srv, "/admin/v1/audit", testAdmin)
	if !strings.Contains(audit, `"ok":true`) || !strings.Contains(audit, `"points_doubled":{"by_order":{},"total":0}`) {
		t.Fatalf("audit after the consumer: %s", audit)
	}
}
