package faults

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/testenv"
)

// markNeedle is the first statement of the relay's fenced mark
// (events.Outbox.MarkPublished), sent once the broker acknowledged the
// batch: the trap stops the line there.
const markNeedle = "UPDATE event_relay SET marks"

// killAt returns a trap callback that SIGKILLs in and waits until it is
// gone, so that the statement the trap holds reaches the server only on a
// dead connection's open transaction, which the server rolls back.
func killAt(in *shoptest.Instance, killed chan struct{}) func() {
	return func() {
		_ = in.Signal(syscall.SIGKILL)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = in.Wait(ctx)
		close(killed)
	}
}

func waitClosed(t *testing.T, ch chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(60 * time.Second):
		t.Fatalf("%s: not within 60s", what)
	}
}

// The relay's leader SIGKILLed after the broker acknowledged a batch
// holding an order.paid and before it marked it: the row stays
// unpublished and the next leader publishes it again. Within the stream's
// duplicate window the broker answers that republish as a duplicate and
// stores nothing; past it the stream stores a second copy and the
// consumer's inbox makes it a duplicate. Either way no point is credited
// twice and nothing is lost.
func TestEventRelayKilledAfterAckBeforeMark(t *testing.T) {
	const window = 8 * time.Second // the shortest the config accepts with a 2 s lease and 500 ms backoff, rounded up
	for _, tc := range []struct {
		name   string
		env    map[string]string
		before time.Duration // between the kill and the successor's start
	}{
		{"duplicate window 10m: the broker absorbs", nil, 0},
		{fmt.Sprintf("duplicate window %s, republished after it: the inbox absorbs", window),
			map[string]string{"SHOP_EVENTS_DUPLICATE_WINDOW": window.String()}, window + 4*time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.before > 0 {
				needFull(t)
			}
			broker := testenv.StartNATS(t)
			r := newEventsRig(t, broker.URL(), tc.env)
			trap, trapped := newSQLTrap(t, r.env["SHOP_MYSQL_DSN"])
			a := r.serve(trapped)
			killed := make(chan struct{})
			// Order 1's first batch is its order.placed (a batch takes one
			// event per order); its second, the one killed, its order.paid.
			trap.stopAt(markNeedle, func() { trap.stopAt(markNeedle, killAt(a, killed)) })
			consumer := r.consume()
			r.stock(a.URL)
			_ = r.place(context.Background(), a.URL) // committed; its answer may not outlive the kill
			waitClosed(t, killed, "the relay marks order 1's order.paid")
			time.Sleep(tc.before)

			b := r.serve(r.env["SHOP_MYSQL_DSN"])
			r.mustPlace(b.URL, 4)
			r.drained()
			r.settled(10)
			duplicateAcks, _ := r.metric(b.URL, "shop_events_published_total", `result="duplicate"`)
			skipped := metric(t, consumer, "shop_consumer_duplicates_total")
			pastWindow := tc.before > 0
			note := fmt.Sprintf("the successor republished order 1's order.paid; the broker answered it as a duplicate (%d)", int(duplicateAcks))
			if pastWindow {
				note = fmt.Sprintf("the republish of order 1's order.paid was stored again; the inbox skipped it (%d duplicate)", skipped)
			}
			row := r.conclude(b.URL, "relay SIGKILLed after the ack, before its mark", "outbox, "+tc.name, note)
			wantTwice := 0
			if pastWindow {
				wantTwice = 1
			}
			if row.Lost != 0 || row.StoredTwice != wantTwice || row.PointsDoubled != 0 || row.PointsMissing != 0 || row.Unpublished != 0 {
				t.Fatalf("%+v; want 0 lost, %d stored twice, the audit clean", row, wantTwice)
			}
			if !pastWindow && duplicateAcks < 1 || pastWindow && skipped < 1 {
				t.Fatalf("duplicate acks %v, inbox duplicates %d: the republish was not seen", duplicateAcks, skipped)
			}
		})
	}
}

// The broker stopped for several seconds while orders are placed on two
// instances: every order is taken (201), their events wait in the outbox,
// and once the broker is back the backlog drains with nothing lost or
// stored twice.
func TestEventBrokerStoppedWhileOrdersArePlaced(t *testing.T) {
	needFull(t)
	broker := testenv.StartNATS(t)
	r := newEventsRig(t, broker.URL(), nil)
	a, b := r.serve(r.env["SHOP_MYSQL_DSN"]), r.serve(r.env["SHOP_MYSQL_DSN"])
	r.consume()
	r.stock(a.URL)
	r.mustPlace(a.URL, 2)
	r.drained()

	broker.Stop()
	stop := r.traffic(a.URL, b.URL)
	time.Sleep(5 * time.Second)
	placed, err := stop()
	if err != nil {
		t.Fatalf("an order during the outage: %v", err)
	}
	var backlog int64
	if err := r.db.Model(&events.OutboxRow{}).Where("published_at IS NULL").Count(&backlog).Error; err != nil {
		t.Fatal(err)
	}
	if placed == 0 || backlog != int64(2*placed) {
		t.Fatalf("%d orders placed during the outage, backlog %d; want their 2 events each waiting", placed, backlog)
	}
	broker.Start()
	r.drained()
	r.settled(uint64(2 * (placed + 2)))
	row := r.conclude(a.URL, "broker stopped 5s under orders", "outbox, inbox",
		fmt.Sprintf("%d orders placed while it was down, all 201; backlog %d, drained after its return", placed, backlog))
	mustBeExact(t, row)
}

// The shop process SIGKILLed between its order's COMMIT and the publish of
// the order's events (the trap drops MariaDB's answer to that COMMIT and
// kills the process). The outbox row committed with the order, and the
// next instance's relay publishes it; direct delivery had nothing that
// remembered the publish was owed: both events are lost, the order's
// points never credited, and the audit shows it (its outbox row, written
// as the audit's record, stays unpublished).
func TestEventServiceKilledBetweenCommitAndPublish(t *testing.T) {
	for _, tc := range []struct {
		delivery string
		lost     int // events
	}{{"outbox", 0}, {"direct", 2}} {
		t.Run("delivery="+tc.delivery, func(t *testing.T) {
			broker := testenv.StartNATS(t)
			r := newEventsRig(t, broker.URL(), map[string]string{"SHOP_EVENTS_DELIVERY": tc.delivery})
			trap, trapped := newSQLTrap(t, r.env["SHOP_MYSQL_DSN"])
			a := r.serve(trapped)
			killed := make(chan struct{})
			r.consume()
			r.stock(a.URL)
			r.mustPlace(a.URL, 2)
			trap.killAtCommitAfter("INSERT INTO `event_outbox`", killAt(a, killed))
			if err := r.place(context.Background(), a.URL); err == nil {
				t.Fatal("the order whose COMMIT answer was dropped was answered 201")
			}
			waitClosed(t, killed, "the order's COMMIT")

			b := r.serve(r.env["SHOP_MYSQL_DSN"])
			r.mustPlace(b.URL, 2)
			waitUntil(t, "every event but the lost ones published", func() bool {
				var n int64
				return r.db.Model(&events.OutboxRow{}).Where("published_at IS NULL").Count(&n).Error == nil && n == int64(tc.lost)
			})
			r.settled(uint64(10 - tc.lost))
			note := "the next instance's relay published the killed order's events"
			if tc.lost > 0 {
				note = "the killed order's order.placed and order.paid never published: its point missing, both events unpublished"
			}
			row := r.conclude(b.URL, "service SIGKILLed between commit and publish", "delivery="+tc.delivery, note)
			if tc.lost == 0 {
				mustBeExact(t, row)
				return
			}
			if row.Lost != tc.lost || row.PointsMissing != 1 || row.Unpublished != int64(tc.lost) || row.StoredTwice != 0 || row.PointsDoubled != 0 {
				t.Fatalf("%+v; want %d lost, 1 point missing, %d unpublished in the audit", row, tc.lost, tc.lost)
			}
		})
	}
}
