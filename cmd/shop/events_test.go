package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/testenv"
)

// metric reads one unlabelled sample of /metrics.
func metric(t *testing.T, body, name string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + ` (\S+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no %s in /metrics", name)
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The broker stops while orders are placed and paid: every request
// succeeds as usual, /readyz stays 200 and names the broker, the backlog
// grows; once the broker is back the backlog drains and the stream holds
// every event once.
func TestOrdersAreTakenWhileTheBrokerIsDownAndTheirEventsFollow(t *testing.T) {
	broker := testenv.StartNATS(t)
	srv, _ := newTestServer(t, map[string]string{"SHOP_NATS_URL": broker.URL(), "SHOP_EVENTS_RELAY_MAX_BACKOFF": "200ms"})
	c := newContract(t, srv.URL)
	u7 := shoptestToken(t, 7)
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/products", token: testAdmin, status: 201,
		body: `{"sku":"ev-1","name":"Event item","stock":50,"price_cents":100}`})
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/accounts", token: testAdmin, body: `{"id":7,"balance_cents":100000}`, status: 201})
	place := func() int64 {
		var tok struct{ Token string }
		_ = json.Unmarshal(c.run(t, srv, apiCase{method: "POST", path: "/api/v1/idempotency-tokens", token: u7, status: 201}), &tok)
		var o struct{ ID int64 }
		_ = json.Unmarshal(c.run(t, srv, apiCase{method: "POST", path: "/api/v1/orders", token: u7, body: `{"sku":"ev-1","quantity":1}`,
			header: map[string]string{"Idempotency-Key": tok.Token}, status: 201}), &o)
		c.run(t, srv, apiCase{method: "POST", path: fmt.Sprintf("/api/v1/orders/%d/pay", o.ID), token: u7, status: 200})
		return o.ID
	}
	place()

	broker.Stop()
	for range 5 {
		place()
	}
	ready := getOK(t, srv, "/readyz", "")
	if !strings.Contains(ready, `"degraded"`) || !strings.Contains(ready, "nats broker") {
		t.Errorf("/readyz with the broker down: %s; want 200 naming the broker", ready)
	}
	m := getOK(t, srv, "/metrics", "")
	if metric(t, m, "shop_events_broker_connected") != 0 || metric(t, m, "shop_events_backlog") < 10 {
		t.Errorf("metrics with the broker down: connected %v, backlog %v; want 0 and at least 10",
			metric(t, m, "shop_events_broker_connected"), metric(t, m, "shop_events_backlog"))
	}

	broker.Start()
	deadline := time.Now().Add(60 * time.Second)
	for metric(t, getOK(t, srv, "/metrics", ""), "shop_events_backlog") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the backlog did not drain within 60s of the broker's return")
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := streamMessages(t, broker.URL()); n != 12 {
		t.Fatalf("stream holds %d events, want 12 (6 orders placed and paid)", n)
	}
	var audit map[string]json.RawMessage
	_ = json.Unmarshal([]byte(getOK(t, srv, "/admin/v1/audit", testAdmin)), &audit)
	if !strings.Contains(string(audit["unpublished_order_events"]), `"total":0`) {
		t.Errorf("audit: %s", audit["unpublished_order_events"])
	}
}

func streamMessages(t *testing.T, url string) uint64 {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, events.Stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Msgs
}

// A stream the broker refuses (3 replicas on a lone server) stops the
// start with a message that says what to check; a broker that is merely
// down does not.
func TestStartFailsOnAStreamTheBrokerRefusesButNotOnABrokerDown(t *testing.T) {
	broker := testenv.StartNATS(t)
	start := func(env map[string]string) error {
		vars := map[string]string{"SHOP_ENV": "dev"}
		for k, v := range env {
			vars[k] = v
		}
		cfg, err := config.Load(func(k string) string { return vars[k] })
		if err != nil {
			t.Fatal(err)
		}
		a, err := newApp(context.Background(), cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err == nil {
			_ = a.close()
		}
		return err
	}
	err := start(map[string]string{"SHOP_NATS_URL": broker.URL(), "SHOP_EVENTS_REPLICAS": "3"})
	if err == nil || !strings.Contains(err.Error(), "refused the stream") || !strings.Contains(err.Error(), "SHOP_EVENTS_REPLICAS") {
		t.Fatalf("start with 3 replicas on one server: %v", err)
	}
	broker.Stop()
	if err := start(map[string]string{"SHOP_NATS_URL": broker.URL()}); err != nil {
		t.Fatalf("start with the broker down: %v", err)
	}
}
