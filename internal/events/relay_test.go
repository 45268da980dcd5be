package events

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/propagation"
	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/storage"
	"github.com/lockbench/shop/internal/testenv"
)

func random() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// openDB opens a fresh database with the outbox: on MariaDB when
// SHOP_TEST_MYSQL_DSN is set (a database of its own, dropped at the end),
// else on SQLite.
func openDB(t *testing.T) *gorm.DB {
	t.Helper()
	ctx := context.Background()
	o := storage.Options{MaxConns: 10}
	if dsn := os.Getenv("SHOP_TEST_MYSQL_DSN"); dsn != "" {
		cfg, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		root, err := sql.Open("mysql", cfg.FormatDSN())
		if err != nil {
			t.Fatal(err)
		}
		name := "shop_test_events_" + random()
		if _, err := root.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
			root.Close()
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_, _ = root.ExecContext(ctx, "DROP DATABASE "+name)
			root.Close()
		})
		cfg.DBName, cfg.ParseTime, cfg.ClientFoundRows = name, true, true
		o.MySQLDSN = cfg.FormatDSN()
	}
	db, err := storage.Open(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Migrate(ctx, Models()...); err != nil {
		t.Fatal(err)
	}
	return db.DB
}

// appendOrders writes the events of orders first..first+n-1 in one
// transaction per order, as the order store does: placed, then paid.
func appendOrders(t *testing.T, db *gorm.DB, first, n int64) {
	t.Helper()
	for id := first; id < first+n; id++ {
		for _, typ := range []string{TypeOrderPlaced, TypeOrderPaid} {
			e := Event{ID: ID(id, typ), Type: typ, OrderID: id, UserID: 7, SKU: "widget", Quantity: 1,
				AmountCents: 1250, OccurredAt: time.Now().UTC()}
			if err := db.Transaction(func(tx *gorm.DB) error { return Append(context.Background(), tx, e) }); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// broker is a JetStream connection with a stream of the test's own, so
// that tests sharing a server do not see each other's events.
type broker struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	stream StreamOptions
}

func connect(t *testing.T, url string) broker {
	t.Helper()
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond),
		nats.RetryOnFailedConnect(true), nats.ReconnectBufSize(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	r := random()
	b := broker{nc: nc, js: js, stream: StreamOptions{Name: "TEST_EVENTS_" + r, SubjectPrefix: "test." + r + ".",
		DuplicateWindow: time.Minute}}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, b.stream.Name)
	})
	return b
}

// messages returns the event ids the stream holds, in stream order.
func (b broker) messages(t *testing.T) []string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, b.stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
	}
	return ids
}

// redisLocker is a fenced Redis lock on the shared test server, under a
// prefix of its own.
func redisLocker(t *testing.T) lockkit.Locker {
	t.Helper()
	client := redis.NewClient(&redis.Options{Addr: testenv.Require(t, "SHOP_TEST_REDIS_ADDR"), ContextTimeoutEnabled: true})
	prefix := "events_test:" + random() + ":"
	l, err := redislock.New(client, redislock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		for _, pattern := range []string{prefix + "*", "{" + prefix + "*"} {
			it := client.Scan(ctx, 0, pattern, 500).Iterator()
			for it.Next(ctx) {
				client.Del(ctx, it.Val())
			}
		}
		l.Close()
		client.Close()
	})
	return l
}

func newRelay(db *gorm.DB, b broker, locker lockkit.Locker, m *Metrics) *Relay {
	return NewRelay(RelayOptions{Outbox: NewOutbox(db), JS: b.js, Locker: locker, Interval: 20 * time.Millisecond,
		Batch: 50, MaxBackoff: 200 * time.Millisecond, PublishTimeout: 2 * time.Second, Stream: b.stream, Metrics: m})
}

// run runs r until the test ends.
func run(t *testing.T, r *Relay) {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); r.Run(ctx) }()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

// waitDrained waits until the outbox has no unpublished row.
func waitDrained(t *testing.T, db *gorm.DB) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		b, err := NewOutbox(db).Backlog(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if b.Rows == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("backlog of %d not drained after 60s", b.Rows)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// wantEachOnce checks that ids holds each event of orders first..first+n-1
// exactly once, and each order's placed before its paid.
func wantEachOnce(t *testing.T, ids []string, first, n int64) {
	t.Helper()
	at := map[string]int{}
	for i, id := range ids {
		if _, dup := at[id]; dup {
			t.Fatalf("event %s stored twice", id)
		}
		at[id] = i
	}
	if int64(len(ids)) != 2*n {
		t.Fatalf("stream holds %d events, want %d", len(ids), 2*n)
	}
	for id := first; id < first+n; id++ {
		placed, ok1 := at[ID(id, TypeOrderPlaced)]
		paid, ok2 := at[ID(id, TypeOrderPaid)]
		if !ok1 || !ok2 || placed > paid {
			t.Fatalf("order %d: placed at %d (%v), paid at %d (%v)", id, placed, ok1, paid, ok2)
		}
	}
}

func TestRelayPublishesEveryEventOnceInOrderPerOrder(t *testing.T) {
	b := connect(t, testenv.Require(t, testenv.NATSURLVar))
	db := openDB(t)
	m := NewMetrics(prometheus.NewRegistry(), NewOutbox(db), nil)
	appendOrders(t, db, 1, 120)
	run(t, newRelay(db, b, redisLocker(t), m))
	waitDrained(t, db)
	wantEachOnce(t, b.messages(t), 1, 120)
	if got := testutil.ToFloat64(m.publishes.WithLabelValues("stored")); got != 240 {
		t.Fatalf("stored %v, want 240", got)
	}
}

// The stream's 3 replicas on the 3-node cluster: the stream is created
// with them, and every event is stored once.
func TestRelayPublishesToAThreeNodeClusterAtThreeReplicas(t *testing.T) {
	urls := testenv.NATSClusterURLs(t)
	b := connect(t, urls[0]+","+urls[1]+","+urls[2])
	b.stream.Replicas = 3
	db := openDB(t)
	appendOrders(t, db, 1, 30)
	run(t, newRelay(db, b, redisLocker(t), nil))
	waitDrained(t, db)
	wantEachOnce(t, b.messages(t), 1, 30)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, b.stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.Config.Replicas != 3 || info.Cluster == nil || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream info %+v, %v; want 3 replicas", info, err)
	}
}

var errKilled = errors.New("relay killed between the ack and the mark")

// A relay that dies after the broker acknowledged and before it marked
// leaves the rows unpublished; its successor publishes them again, and
// the broker's deduplication (Nats-Msg-Id within the window) stores each
// once and says so in the ack.
func TestRelayKilledBeforeItsMarkRepublishesAndTheBrokerDeduplicates(t *testing.T) {
	b := connect(t, testenv.Require(t, testenv.NATSURLVar))
	db := openDB(t)
	appendOrders(t, db, 1, 10)
	ctx := context.Background()
	first := newRelay(db, b, redisLocker(t), nil)
	first.afterPublish = func() error { return errKilled }
	if _, err := first.Round(ctx, 0); !errors.Is(err, errKilled) {
		t.Fatalf("round: %v", err)
	}
	if bl, err := NewOutbox(db).Backlog(ctx); err != nil || bl.Rows != 20 {
		t.Fatalf("backlog %+v, %v; want all 20 rows still unpublished", bl, err)
	}
	m := NewMetrics(prometheus.NewRegistry(), NewOutbox(db), nil)
	successor := newRelay(db, b, redisLocker(t), m)
	run(t, successor)
	waitDrained(t, db)
	wantEachOnce(t, b.messages(t), 1, 10)
	// The first relay published the 10 placed events (one per order per
	// batch); their republish is absorbed.
	if dup := testutil.ToFloat64(m.publishes.WithLabelValues("duplicate")); dup != 10 {
		t.Fatalf("duplicates absorbed %v, want 10", dup)
	}
}

// The broker stops while orders keep committing their events: the relay
// fails, backs off and retries; the backlog grows and, once the broker is
// back, drains with every event stored once.
func TestBrokerOutageLosesNoEvent(t *testing.T) {
	srv := testenv.StartNATS(t)
	b := connect(t, srv.URL())
	db := openDB(t)
	m := NewMetrics(prometheus.NewRegistry(), NewOutbox(db), b.nc.IsConnected)
	appendOrders(t, db, 1, 5)
	run(t, newRelay(db, b, redisLocker(t), m))
	waitDrained(t, db)

	srv.Stop()
	appendOrders(t, db, 6, 20)
	deadline := time.Now().Add(30 * time.Second)
	for testutil.ToFloat64(m.errors) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if bl, err := NewOutbox(db).Backlog(context.Background()); err != nil || bl.Rows != 40 || testutil.ToFloat64(m.errors) == 0 {
		t.Fatalf("while the broker is down: backlog %+v, %v, errors %v; want 40 rows waiting and errors counted",
			bl, err, testutil.ToFloat64(m.errors))
	}

	srv.Start()
	waitDrained(t, db)
	wantEachOnce(t, b.messages(t), 1, 25)
}

// Two relays, each with its lease from the same lock: only the holder
// publishes and marks, so no event is published twice; and a relay whose
// lease a newer holder took over cannot mark (its fence is refused).
func TestTwoRelaysNeverBothMark(t *testing.T) {
	t.Run("concurrent", func(t *testing.T) {
		b := connect(t, testenv.Require(t, testenv.NATSURLVar))
		db := openDB(t)
		m := NewMetrics(prometheus.NewRegistry(), NewOutbox(db), nil)
		locker := redisLocker(t)
		run(t, newRelay(db, b, locker, m))
		run(t, newRelay(db, b, locker, m))
		for first := int64(1); first <= 200; first += 20 {
			appendOrders(t, db, first, 20)
		}
		waitDrained(t, db)
		wantEachOnce(t, b.messages(t), 1, 200)
		if dup := testutil.ToFloat64(m.publishes.WithLabelValues("duplicate")); dup != 0 {
			t.Fatalf("%v events published twice", dup)
		}
	})
	t.Run("fenced", func(t *testing.T) {
		db := openDB(t)
		ctx := context.Background()
		appendOrders(t, db, 1, 1)
		outbox := NewOutbox(db)
		if err := outbox.Claim(ctx, 10); err != nil {
			t.Fatal(err)
		}
		if err := outbox.Claim(ctx, 11); err != nil {
			t.Fatal(err)
		}
		if err := outbox.Claim(ctx, 10); !errors.Is(err, lockkit.ErrFenced) {
			t.Fatalf("an older relay claimed: %v", err)
		}
		rows, err := outbox.Unpublished(ctx, 10)
		if err != nil || len(rows) != 1 {
			t.Fatalf("unpublished %+v, %v", rows, err)
		}
		if err := outbox.MarkPublished(ctx, 10, []int64{rows[0].Seq}); !errors.Is(err, lockkit.ErrFenced) {
			t.Fatalf("mark by a relay taken over: %v; want ErrFenced", err)
		}
		if bl, _ := outbox.Backlog(ctx); bl.Rows != 2 {
			t.Fatalf("a refused mark marked: backlog %+v", bl)
		}
		if err := outbox.MarkPublished(ctx, 11, []int64{rows[0].Seq}); err != nil {
			t.Fatal(err)
		}
	})
}

// The outbox hands out at most one event per order per batch: a later
// event waits until the earlier is marked.
func TestUnpublishedTakesOneEventPerOrder(t *testing.T) {
	db := openDB(t)
	appendOrders(t, db, 1, 3)
	rows, err := NewOutbox(db).Unpublished(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rows {
		got = append(got, r.EventID)
	}
	if want := fmt.Sprint([]string{ID(1, TypeOrderPlaced), ID(2, TypeOrderPlaced), ID(3, TypeOrderPlaced)}); fmt.Sprint(got) != want {
		t.Fatalf("batch %v, want %v", got, want)
	}
}

// The outbox row keeps the trace context of the request that made the
// change, and the published message carries that trace on, so that the
// consumer's span joins the request's trace.
func TestRelayCarriesTheRequestsTraceToTheMessage(t *testing.T) {
	b := connect(t, testenv.Require(t, testenv.NATSURLVar))
	db := openDB(t)
	const traceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	parent := propagation.TraceContext{}.Extract(context.Background(),
		propagation.MapCarrier{"traceparent": "00-" + traceID + "-00f067aa0ba902b7-01"})
	e := Event{ID: ID(1, TypeOrderPlaced), Type: TypeOrderPlaced, OrderID: 1}
	if err := db.Transaction(func(tx *gorm.DB) error { return Append(parent, tx, e) }); err != nil {
		t.Fatal(err)
	}
	row, err := NewOutbox(db).Row(context.Background(), e.ID)
	if err != nil || !strings.Contains(row.Traceparent, traceID) {
		t.Fatalf("outbox row traceparent %q, %v; want trace %s", row.Traceparent, err, traceID)
	}
	if _, err := newRelay(db, b, nil, nil).Round(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := b.js.Stream(ctx, b.stream.Name)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if tp := m.Header.Get("traceparent"); !strings.Contains(tp, traceID) {
		t.Fatalf("message traceparent %q; want trace %s", tp, traceID)
	}
}

// Direct delivery publishes once, right after the commit: what the broker
// missed then stays unpublished for good (no relay reads the outbox),
// which the audit counts; what it took is marked.
func TestDirectDeliveryLosesWhatTheBrokerMissed(t *testing.T) {
	srv := testenv.StartNATS(t)
	b := connect(t, srv.URL())
	db := openDB(t)
	appendOrders(t, db, 1, 2)
	d := NewDirect(RelayOptions{Outbox: NewOutbox(db), JS: b.js, PublishTimeout: time.Second, Stream: b.stream})
	ctx := context.Background()
	d.Publish(ctx, ID(1, TypeOrderPlaced), ID(1, TypeOrderPaid))
	srv.Stop()
	d.Publish(ctx, ID(2, TypeOrderPlaced), ID(2, TypeOrderPaid))
	srv.Start()
	for deadline := time.Now().Add(30 * time.Second); !b.nc.IsConnected(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no reconnection within 30s")
		}
	}
	bl, err := NewOutbox(db).Backlog(ctx)
	if err != nil || bl.Rows != 2 {
		t.Fatalf("backlog %+v, %v; want order 2's two events, lost", bl, err)
	}
	if ids := b.messages(t); fmt.Sprint(ids) != fmt.Sprint([]string{ID(1, TypeOrderPlaced), ID(1, TypeOrderPaid)}) {
		t.Fatalf("stream holds %v; want order 1's events only", ids)
	}
}
