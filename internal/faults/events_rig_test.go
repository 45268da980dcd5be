package faults

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/loyalty"
	"github.com/lockbench/shop/internal/order"
	"github.com/lockbench/shop/internal/shoptest"
)

// The order-event delivery faults: what reaches the stream, and through
// it the loyalty consumer, when the relay, the broker or the service dies
// at the wrong moment. Each row counts every event the orders say
// happened against the copies the stream holds, and reads the audit.

// deliveryRow is one line of the delivery table.
type deliveryRow struct {
	Fault, Config string
	// Events the orders say happened (placed and paid per order).
	Events int
	// Lost: of those, the ones the stream does not hold.
	Lost int
	// StoredTwice: copies in the stream beyond the first of an event.
	StoredTwice int
	// The audit's totals, read with every order aged past its grace.
	PointsDoubled, PointsMissing, Unpublished int64
	Note                                      string
}

var deliveryTable struct {
	mu   sync.Mutex
	rows []deliveryRow
}

func reportDelivery(r deliveryRow) {
	deliveryTable.mu.Lock()
	defer deliveryTable.mu.Unlock()
	deliveryTable.rows = append(deliveryTable.rows, r)
}

func printDeliveryTable(w io.Writer) {
	deliveryTable.mu.Lock()
	defer deliveryTable.mu.Unlock()
	if len(deliveryTable.rows) == 0 {
		return
	}
	rows := append([]deliveryRow(nil), deliveryTable.rows...)
	sort.SliceStable(rows, func(i, j int) bool { return deliveryRank(rows[i].Fault) < deliveryRank(rows[j].Fault) })
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT DELIVERY FAULT\tCONFIG\tEVENTS\tLOST\tSTORED TWICE\tPOINTS DOUBLED\tPOINTS MISSING\tUNPUBLISHED\tWHAT IT SHOWED")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%s\n", r.Fault, r.Config, r.Events, r.Lost, r.StoredTwice,
			r.PointsDoubled, r.PointsMissing, r.Unpublished, r.Note)
	}
	tw.Flush()
}

// deliveryRank orders the table along an event's way out: the relay, the
// broker, the cluster behind it, and the service before them all.
func deliveryRank(fault string) int {
	for i, p := range []string{"relay", "broker", "stream leader", "quorum", "service"} {
		if strings.HasPrefix(fault, p) {
			return i
		}
	}
	return 99
}

const (
	eventSKU   = "fault-events"
	eventPrice = 100 // one loyalty point per order
)

// eventsRig is a private database, the shop processes that place orders
// and relay their events to a broker given by URL, a shop consume that
// credits their points, and a client of that broker that reads the stream.
type eventsRig struct {
	*rig
	t  *testing.T
	db *gorm.DB
	js jetstream.JetStream
}

// newEventsRig prepares shop processes on natsURL: the redis lock backend
// for the relay's lease, a short lease so that a successor leads soon
// after a crash, a short backoff so that a returning broker is tried soon,
// and no consumer inside serve (shop consume runs apart). env goes on top.
func newEventsRig(t *testing.T, natsURL string, env map[string]string) *eventsRig {
	t.Helper()
	base := lockEnv(t, "redis")
	for k, v := range map[string]string{"SHOP_NATS_URL": natsURL, "SHOP_EVENTS_CONSUME_IN_SERVE": "false",
		"SHOP_LOCK_TTL": "2s", "SHOP_EVENTS_RELAY_MAX_BACKOFF": "500ms", "SHOP_EVENTS_DEDUP": events.DedupInbox} {
		base[k] = v
	}
	for k, v := range env {
		base[k] = v
	}
	r := &eventsRig{rig: newRig(t, base), t: t}
	db, err := gorm.Open(gormmysql.Open(r.env["SHOP_MYSQL_DSN"]), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	t.Cleanup(func() { sqlDB.Close() })
	r.db = db
	nc, err := nats.Connect(natsURL, nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if r.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	return r
}

// serve starts shop serve on dsn (the database directly, or a trap in
// front of it).
func (r *eventsRig) serve(dsn string) *shoptest.Instance {
	r.t.Helper()
	env := map[string]string{"SHOP_MYSQL_DSN": dsn}
	for k, v := range r.env {
		if k != "SHOP_MYSQL_DSN" {
			env[k] = v
		}
	}
	in := shoptest.Start(r.t, r.bin, env)
	r.t.Cleanup(func() { _ = in.Signal(sigCont) })
	return in
}

// consume starts shop consume, deduplicating with the inbox.
func (r *eventsRig) consume() *shoptest.Instance {
	r.t.Helper()
	return shoptest.StartCommand(r.t, r.bin, "consume", r.env)
}

// stock creates the product and the buyer's account on url.
func (r *eventsRig) stock(url string) {
	r.t.Helper()
	r.client.Must(r.t, http.StatusCreated, "POST", url+"/admin/v1/products", r.admin,
		map[string]any{"sku": eventSKU, "name": eventSKU, "stock": 1_000_000, "price_cents": eventPrice})
	r.client.Must(r.t, http.StatusCreated, "POST", url+"/admin/v1/accounts", r.admin,
		map[string]any{"id": buyer, "balance_cents": int64(1_000_000_000)})
}

// place places and pays one order on url, and reports anything but 201.
func (r *eventsRig) place(ctx context.Context, url string) error {
	tok := r.token(buyer)
	status, body, err := r.send(ctx, "POST", url+"/api/v1/idempotency-tokens", tok, "", "")
	if err != nil || status != http.StatusCreated {
		return fmt.Errorf("idempotency token: %d %s %v", status, body, err)
	}
	var issued struct{ Token string }
	if err := json.Unmarshal(body, &issued); err != nil {
		return fmt.Errorf("idempotency token %s: %w", body, err)
	}
	status, body, err = r.send(ctx, "POST", url+"/api/v1/orders", tok, issued.Token, `{"sku":"`+eventSKU+`","quantity":1,"pay":true}`)
	if err != nil || status != http.StatusCreated {
		return fmt.Errorf("place: %d %s %v", status, body, err)
	}
	return nil
}

// mustPlace places n orders on url.
func (r *eventsRig) mustPlace(url string, n int) {
	r.t.Helper()
	for range n {
		if err := r.place(context.Background(), url); err != nil {
			r.t.Fatal(err)
		}
	}
}

// traffic places orders on urls in turn, one after another, until stop
// is called, which returns how many were answered 201 and the first other
// answer. stop lets the order in flight finish rather than hang up on it:
// an order whose client hung up is still placed, and would be one the
// count leaves out.
func (r *eventsRig) traffic(urls ...string) (stop func() (placed int, err error)) {
	var stopping atomic.Bool
	var placed int
	var first error
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := 0; !stopping.Load(); i++ {
			if err := r.place(context.Background(), urls[i%len(urls)]); err == nil {
				placed++
			} else if first == nil {
				first = err
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return func() (int, error) {
		stopping.Store(true)
		<-done
		return placed, first
	}
}

// drained waits until the outbox has no unpublished row.
func (r *eventsRig) drained() {
	r.t.Helper()
	waitUntil(r.t, "the outbox drains", func() bool {
		var n int64
		return r.db.Model(&events.OutboxRow{}).Where("published_at IS NULL").Count(&n).Error == nil && n == 0
	})
}

// settled waits until the stream holds at least want messages and the
// loyalty consumer has taken and acknowledged all of them.
func (r *eventsRig) settled(want uint64) {
	r.t.Helper()
	waitUntil(r.t, fmt.Sprintf("the consumer acknowledges %d events", want), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := r.js.Stream(ctx, events.Stream)
		if err != nil {
			return false
		}
		si, err := s.Info(ctx)
		if err != nil || si.State.Msgs < want {
			return false
		}
		c, err := s.Consumer(ctx, loyalty.ConsumerName)
		if err != nil {
			return false
		}
		ci, err := c.Info(ctx)
		return err == nil && ci.AckFloor.Stream >= si.State.LastSeq && ci.NumPending == 0 && ci.NumAckPending == 0
	})
}

// expected lists the events the orders' statuses say happened.
func (r *eventsRig) expected() []string {
	r.t.Helper()
	var orders []order.Order
	if err := r.db.Select("id", "status").Find(&orders).Error; err != nil {
		r.t.Fatal(err)
	}
	var ids []string
	for _, o := range orders {
		ids = append(ids, events.ID(o.ID, events.TypeOrderPlaced))
		switch o.Status {
		case order.StatusPaid:
			ids = append(ids, events.ID(o.ID, events.TypeOrderPaid))
		case order.StatusCancelled:
			ids = append(ids, events.ID(o.ID, events.TypeOrderCancelled))
		}
	}
	return ids
}

// copies counts the stream's messages per Nats-Msg-Id.
func (r *eventsRig) copies() map[string]int {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	s, err := r.js.Stream(ctx, events.Stream)
	if err != nil {
		r.t.Fatal(err)
	}
	si, err := s.Info(ctx)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]int{}
	for seq := si.State.FirstSeq; seq > 0 && seq <= si.State.LastSeq; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			r.t.Fatalf("stream message %d: %v", seq, err)
		}
		out[m.Header.Get(jetstream.MsgIDHeader)]++
	}
	return out
}

// ageOrders moves the orders' payments and their outbox rows two minutes
// into the past, past the audit's grace (a minute for a missing credit and
// for an unpublished event): the audit then counts every loss at once,
// as it would a minute later.
func (r *eventsRig) ageOrders() {
	r.t.Helper()
	for _, q := range []string{
		"UPDATE orders SET paid_at = paid_at - INTERVAL 2 MINUTE WHERE paid_at IS NOT NULL",
		"UPDATE event_outbox SET created_at = created_at - INTERVAL 2 MINUTE",
	} {
		if err := r.db.Exec(q).Error; err != nil {
			r.t.Fatal(err)
		}
	}
}

// conclude counts the row's events against the stream's copies, ages the
// orders, reads the audit on url, and reports the row.
func (r *eventsRig) conclude(url, fault, config, note string) deliveryRow {
	r.t.Helper()
	want := r.expected()
	copies := r.copies()
	row := deliveryRow{Fault: fault, Config: config, Events: len(want), Note: note}
	for _, id := range want {
		if copies[id] == 0 {
			row.Lost++
			r.describeLost(id)
		}
	}
	for _, n := range copies {
		row.StoredTwice += n - 1
	}
	r.ageOrders()
	a := r.orderAudit(url)
	row.PointsDoubled, row.PointsMissing = a.Totals["points_doubled"], a.Totals["points_missing"]
	row.Unpublished = a.Totals["unpublished_order_events"]
	reportDelivery(row)
	if a.Totals["dead_letters"] != 0 {
		r.t.Errorf("dead letters: %s", a.Raw)
	}
	return row
}

// describeLost logs what the outbox says of an event the stream lacks.
func (r *eventsRig) describeLost(id string) {
	r.t.Helper()
	var row events.OutboxRow
	err := r.db.Where("event_id = ?", id).First(&row).Error
	r.t.Logf("lost %s: outbox seq %d created %s published %v (%v)", id, row.Seq, row.CreatedAt.Format(time.RFC3339Nano), row.PublishedAt, err)
}

// mustBeExact fails the test unless row lost nothing, stored nothing
// twice, and the audit saw no doubled, missing or unpublished event.
func mustBeExact(t *testing.T, row deliveryRow) {
	t.Helper()
	if row.Events == 0 || row.Lost != 0 || row.StoredTwice != 0 || row.PointsDoubled != 0 || row.PointsMissing != 0 || row.Unpublished != 0 {
		t.Fatalf("%+v; want every event once, the audit clean", row)
	}
}
