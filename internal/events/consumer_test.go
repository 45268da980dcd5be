package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
	"github.com/lockbench/shop/internal/testenv"
)

// tally is an effect that is not idempotent by nature: every Apply adds
// one to its event's count.
type tally struct {
	EventID string `gorm:"primaryKey;size:128"`
	N       int64  `gorm:"not null"`
}

func (tally) TableName() string { return "test_tally" }

// tallyEffect counts order.paid events; an order id of 0 or below is
// "not found".
type tallyEffect struct{}

func (tallyEffect) Handles(typ string) bool { return typ == TypeOrderPaid }

func (tallyEffect) Apply(ctx context.Context, tx *gorm.DB, e Event) error {
	if e.OrderID >= 1_000_000 {
		return Reject(ReasonOrderNotFound, "no order %d", e.OrderID)
	}
	return tx.Clauses(clause.OnConflict{DoUpdates: clause.Assignments(map[string]any{"n": gorm.Expr("n + 1")})}).
		Create(&tally{EventID: e.ID, N: 1}).Error
}

// rig is one test's broker stream and database.
type rig struct {
	t       *testing.T
	js      jetstream.JetStream
	stream  string
	subject string // prefix; events go to subject + type
	db      *gorm.DB
	store   *ConsumerStore
}

// newRig makes a stream of its own on the test server (tests share the
// server, so the stream and subjects are named at random) and a MariaDB
// database with the consumer's tables.
func newRig(t *testing.T) *rig {
	t.Helper()
	nc, err := nats.Connect(testenv.Require(t, "SHOP_TEST_NATS_URL"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, js: js, stream: "TEST_" + strings.ToUpper(shoptest.Random(8)), subject: "t" + shoptest.Random(8) + "."}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: r.stream, Subjects: []string{r.subject + ">"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), r.stream) })
	db, err := storage.Open(ctx, storage.Options{MySQLDSN: shoptest.MySQL(t), MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Migrate(ctx, append(ConsumerModels(), &tally{})...); err != nil {
		t.Fatal(err)
	}
	r.db, r.store = db.DB, NewConsumerStore(db.DB)
	return r
}

// publish sends payload on subject+typ without a Nats-Msg-Id, so that the
// broker keeps every copy: each is a delivery of the same event.
func (r *rig) publish(typ string, payload []byte) {
	r.t.Helper()
	if _, err := r.js.Publish(context.Background(), r.subject+typ, payload); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) publishEvent(e Event) {
	r.t.Helper()
	b, err := json.Marshal(e)
	if err != nil {
		r.t.Fatal(err)
	}
	r.publish(e.Type, b)
}

// consumer returns a consumer of the rig's stream; several share the
// durable, as processes do.
func (r *rig) consumer(dedup Dedup, ackWait time.Duration, m *ConsumerMetrics) *Consumer {
	r.t.Helper()
	c, err := NewConsumer(ConsumerOptions{Name: "tally", Stream: r.stream, FilterSubject: r.subject + ">",
		AckWait: ackWait, MaxDeliver: 3, Dedup: dedup, Store: r.store, Effect: tallyEffect{}, Metrics: m,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// run runs c until the test ends.
func (r *rig) run(c *Consumer) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.Run(ctx, r.js); err != nil {
			r.t.Errorf("consumer: %v", err)
		}
	}()
	r.t.Cleanup(func() { cancel(); <-done })
}

// drained waits until the durable has acked or terminated every message
// of the stream.
func (r *rig) drained(n uint64) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for {
		info, err := r.js.Consumer(ctx, r.stream, "tally")
		if err == nil {
			ci := info.CachedInfo()
			if fresh, err := info.Info(ctx); err == nil {
				ci = fresh
			}
			if ci.AckFloor.Stream >= n && ci.NumAckPending == 0 {
				return
			}
		}
		select {
		case <-ctx.Done():
			r.t.Fatalf("the consumer did not settle %d messages", n)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (r *rig) count(eventID string) int64 {
	r.t.Helper()
	var n tally
	if err := r.db.Where("event_id = ?", eventID).Take(&n).Error; err != nil && !errors.Is(err, gorm.ErrRecordNotFound) {
		r.t.Fatal(err)
	}
	return n.N
}

func paid(order int64) Event {
	return Event{ID: ID(order, TypeOrderPaid), Type: TypeOrderPaid, OrderID: order, UserID: 1, AmountCents: 1000}
}

func (r *rig) dedup(mode string, locker lockkit.Locker, opts ...lockkit.Option) Dedup {
	r.t.Helper()
	d, err := NewDedup(DedupOptions{Mode: mode, DB: r.db, Locker: locker, LockOptions: opts})
	if err != nil {
		r.t.Fatal(err)
	}
	return d
}

// The same event delivered twice (two copies on the stream, as a
// republish outside the broker's duplicate window leaves them) applies
// once with the inbox and with the lock, and twice without dedup.
func TestRedeliveredEventAppliesOnceUnlessDedupIsNone(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want int64
	}{{DedupInbox, 1}, {DedupLock, 1}, {DedupNone, 2}} {
		t.Run(tc.mode, func(t *testing.T) {
			r := newRig(t)
			reg := prometheus.NewRegistry()
			m := NewConsumerMetrics(reg)
			r.run(r.consumer(r.dedup(tc.mode, redisLocker(t)), 5*time.Second, m))
			e := paid(7)
			r.publishEvent(e)
			r.publishEvent(e)
			r.drained(2)
			if got := r.count(e.ID); got != tc.want {
				t.Fatalf("%s: event applied %d times, want %d", tc.mode, got, tc.want)
			}
			if got := testutil.ToFloat64(m.appliedTotal.WithLabelValues("tally")); got != float64(tc.want) {
				t.Errorf("applied metric %v, want %d", got, tc.want)
			}
			if got := testutil.ToFloat64(m.duplicatesTotal.WithLabelValues("tally")); got != float64(2-tc.want) {
				t.Errorf("duplicates metric %v, want %d", got, 2-tc.want)
			}
		})
	}
}

// A consumer that committed the effect and died before its ack (here: it
// never acks, and never pulls again) leaves the message to be redelivered
// after AckWait, to the other consumer sharing the durable.
func TestEffectCommittedButNotAckedIsRedeliveredAndAppliedOnceUnlessDedupIsNone(t *testing.T) {
	for _, tc := range []struct {
		mode string
		want int64
	}{{DedupInbox, 1}, {DedupLock, 1}, {DedupNone, 2}} {
		t.Run(tc.mode, func(t *testing.T) {
			r := newRig(t)
			m := NewConsumerMetrics(prometheus.NewRegistry())
			dedup := r.dedup(tc.mode, redisLocker(t), lockkit.WithTTL(time.Second))
			dying := r.consumer(dedup, time.Second, m)
			died := make(chan struct{})
			var once sync.Once
			ctx, cancel := context.WithCancel(context.Background())
			// Stuck until the test ends: this consumer never acks in time.
			dying.afterCommit = func(Event) { once.Do(func() { close(died) }); <-ctx.Done() }
			dyingDone := make(chan struct{})
			go func() { defer close(dyingDone); _ = dying.Run(ctx, r.js) }()
			defer func() { cancel(); <-dyingDone }()

			e := paid(8)
			r.publishEvent(e)
			select {
			case <-died:
			case <-time.After(30 * time.Second):
				t.Fatal("the first consumer never committed")
			}
			r.run(r.consumer(dedup, time.Second, m))
			r.drained(1)
			if got := r.count(e.ID); got != tc.want {
				t.Fatalf("%s: event applied %d times, want %d", tc.mode, got, tc.want)
			}
			if got := testutil.ToFloat64(m.redeliveriesTotal.WithLabelValues("tally")); got < 1 {
				t.Errorf("redeliveries metric %v, want at least 1", got)
			}
		})
	}
}

// The lock recipe with a consumer paused past both its lease and AckWait
// while a second consumer takes the redelivery: the fenced grant's late
// write is refused by the mark; the unfenced grant's lands, a double.
func TestPausedLockHolderAppliesOnceOnlyWhenFenced(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts []lockkit.Option
		want int64
	}{
		{"fenced", nil, 1},
		{"unfenced", []lockkit.Option{lockkit.WithoutFence()}, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			locker := redisLocker(t)
			opts := append([]lockkit.Option{lockkit.WithTTL(500 * time.Millisecond)}, tc.opts...)
			paused, resume := make(chan struct{}), make(chan struct{})
			var once sync.Once
			stalling, err := NewDedup(DedupOptions{Mode: DedupLock, DB: r.db, Locker: locker, LockOptions: opts,
				beforeWrite: func(context.Context) {
					once.Do(func() { close(paused); <-resume })
				}})
			if err != nil {
				t.Fatal(err)
			}
			m := NewConsumerMetrics(prometheus.NewRegistry())
			first := r.consumer(stalling, time.Second, m)
			ctx, cancel := context.WithCancel(context.Background())
			firstDone := make(chan struct{})
			go func() { defer close(firstDone); _ = first.Run(ctx, r.js) }()
			defer func() { cancel(); <-firstDone }()

			e := paid(9)
			r.publishEvent(e)
			<-paused
			r.run(r.consumer(r.dedup(DedupLock, locker, opts...), time.Second, m))
			r.drained(1)
			if got := r.count(e.ID); got != 1 {
				t.Fatalf("the second consumer applied %d times, want 1", got)
			}
			close(resume)
			waitFor(t, func() bool {
				return testutil.ToFloat64(m.consumedTotal.WithLabelValues("tally")) >= 2 &&
					(r.count(e.ID) == tc.want || testutil.ToFloat64(m.fencedTotal.WithLabelValues("tally")) == 1)
			})
			// Let a late write land if it is going to.
			cancel()
			<-firstDone
			if got := r.count(e.ID); got != tc.want {
				t.Fatalf("%s: event applied %d times, want %d", tc.name, got, tc.want)
			}
		})
	}
}

// Messages that can never apply go to the dead-letter table with their
// reason, once each, and the messages behind them still apply.
func TestPoisonMessagesAreDeadLetteredAndTheRestApply(t *testing.T) {
	r := newRig(t)
	m := NewConsumerMetrics(prometheus.NewRegistry())
	r.run(r.consumer(r.dedup(DedupInbox, nil), 5*time.Second, m))
	r.publish(TypeOrderPaid, []byte("{not json"))
	r.publish("order.refunded", []byte(`{"id":"order:1:order.refunded","type":"order.refunded","order_id":1}`))
	r.publishEvent(Event{ID: "order:2:order.paid", Type: TypeOrderPaid, OrderID: 3})
	r.publishEvent(paid(1_000_001))
	r.publishEvent(Event{ID: ID(4, TypeOrderPlaced), Type: TypeOrderPlaced, OrderID: 4})
	good := paid(5)
	r.publishEvent(good)
	r.drained(6)

	if got := r.count(good.ID); got != 1 {
		t.Fatalf("the good event applied %d times, want 1", got)
	}
	got, err := r.store.DeadLetters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{ReasonUndecodable: 1, ReasonUnknownType: 1, ReasonInvalid: 1, ReasonOrderNotFound: 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("dead letters by reason %v, want %v", got, want)
	}
	for reason, n := range want {
		if v := testutil.ToFloat64(m.deadLettersTotal.WithLabelValues("tally", reason)); v != float64(n) {
			t.Errorf("dead letter metric %s = %v, want %d", reason, v, n)
		}
	}
}

// An effect that fails on every delivery is dead-lettered on the last one
// (MaxDeliver), not retried for ever.
func TestEffectFailingEveryDeliveryIsDeadLetteredAfterMaxDeliver(t *testing.T) {
	r := newRig(t)
	// The tally table gone, every Apply fails.
	if err := r.db.Migrator().DropTable(&tally{}); err != nil {
		t.Fatal(err)
	}
	m := NewConsumerMetrics(prometheus.NewRegistry())
	c := r.consumer(r.dedup(DedupInbox, nil), 200*time.Millisecond, m)
	r.run(c)
	r.publishEvent(paid(10))
	r.drained(1)
	got, err := r.store.DeadLetters(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got[ReasonMaxDeliveries] != 1 || len(got) != 1 {
		t.Fatalf("dead letters %v, want one %s", got, ReasonMaxDeliveries)
	}
	letters, err := r.store.ListDeadLetters(context.Background(), 10)
	if err != nil {
		t.Fatal(err)
	}
	if letters[0].Deliveries != 3 || letters[0].EventID != ID(10, TypeOrderPaid) {
		t.Fatalf("dead letter %+v, want event %s after 3 deliveries", letters[0], ID(10, TypeOrderPaid))
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 60s")
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// The consumer's span continues the trace whose traceparent the message
// carries, whether the producer wrote the header name as is or
// canonicalized it (propagation.HeaderCarrier does).
func TestConsumerSpanContinuesTheTraceInTheMessageHeaders(t *testing.T) {
	spans := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	prevTP, prevProp := otel.GetTracerProvider(), otel.GetTextMapPropagator()
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	t.Cleanup(func() { otel.SetTracerProvider(prevTP); otel.SetTextMapPropagator(prevProp) })

	r := newRig(t)
	r.run(r.consumer(r.dedup(DedupInbox, nil), 5*time.Second, nil))
	parents := map[string]string{ // header name: trace id
		"traceparent": "4bf92f3577b34da6a3ce929d0e0e4736",
		"Traceparent": "5bf92f3577b34da6a3ce929d0e0e4737",
	}
	order := int64(20)
	for header, traceID := range parents {
		b, _ := json.Marshal(paid(order))
		msg := nats.NewMsg(r.subject + TypeOrderPaid)
		msg.Data = b
		msg.Header[header] = []string{"00-" + traceID + "-00f067aa0ba902b7-01"}
		if _, err := r.js.PublishMsg(context.Background(), msg); err != nil {
			t.Fatal(err)
		}
		order++
	}
	r.drained(2)
	got := map[string]bool{}
	for _, s := range spans.GetSpans() {
		if s.SpanKind == trace.SpanKindConsumer && s.Parent.IsRemote() {
			got[s.SpanContext.TraceID().String()] = true
		}
	}
	for header, traceID := range parents {
		if !got[traceID] {
			t.Errorf("no consumer span in trace %s (header %q); spans: %d", traceID, header, len(spans.GetSpans()))
		}
	}
}

// The server takes the consumer's settings for any MaxDeliver config
// accepts, 1 included (a BackOff must be shorter than MaxDeliver).
func TestConsumerConfigIsAcceptedForEveryMaxDeliver(t *testing.T) {
	r := newRig(t)
	for _, maxDeliver := range []int{1, 2, 5, 20} {
		o := ConsumerOptions{Name: fmt.Sprintf("max%d", maxDeliver), AckWait: 30 * time.Second, MaxDeliver: maxDeliver,
			FilterSubject: r.subject + ">"}
		if _, err := r.js.CreateOrUpdateConsumer(context.Background(), r.stream, o.Config()); err != nil {
			t.Errorf("MaxDeliver %d: %v", maxDeliver, err)
		}
	}
}

// A consumer started before the relay created the stream waits for it,
// then consumes.
func TestConsumerWaitsForTheStream(t *testing.T) {
	r := newRig(t)
	late := r.stream + "_LATE"
	c := r.consumer(r.dedup(DedupInbox, nil), 5*time.Second, nil)
	c.o.Stream, c.o.FilterSubject = late, "late"+r.subject+">"
	r.run(c)
	time.Sleep(300 * time.Millisecond) // a retry or two
	if _, err := r.js.CreateStream(context.Background(), jetstream.StreamConfig{Name: late, Subjects: []string{"late" + r.subject + ">"}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.js.DeleteStream(context.Background(), late) })
	e := paid(30)
	b, _ := json.Marshal(e)
	if _, err := r.js.Publish(context.Background(), "late"+r.subject+e.Type, b); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return r.count(e.ID) == 1 })
}

// A consumer whose broker is down when it starts waits for it instead of
// failing: the orders it will credit are still being paid meanwhile.
func TestConsumerStartedWhileTheBrokerIsDownWaitsForIt(t *testing.T) {
	r := newRig(t) // for the database
	broker := testenv.StartNATS(t)
	broker.Stop()
	nc, err := nats.Connect(broker.URL(), nats.RetryOnFailedConnect(true), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c := r.consumer(r.dedup(DedupInbox, nil), 5*time.Second, nil)
	c.o.Stream, c.o.FilterSubject = Stream, Subjects
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx, js) }()
	defer func() { cancel(); <-done }()
	time.Sleep(500 * time.Millisecond)
	select {
	case err := <-done:
		t.Fatalf("the consumer gave up while the broker was down: %v", err)
	default:
	}
	broker.Start()
	if _, err := js.CreateStream(context.Background(), jetstream.StreamConfig{Name: Stream, Subjects: []string{Subjects}}); err != nil {
		t.Fatal(err)
	}
	e := paid(40)
	b, _ := json.Marshal(e)
	if _, err := js.Publish(context.Background(), e.Subject(), b); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return r.count(e.ID) == 1 })
}
