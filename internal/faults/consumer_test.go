package faults

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/loyalty"
	"github.com/lockbench/shop/internal/order"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
	"github.com/lockbench/shop/internal/testenv"
)

// eventRow is one line of the order-event table: what a fault did to the
// events' effects under one configuration.
type eventRow struct {
	Fault, Config string
	Events        int   // events published
	Doubled       int64 // points credited beyond what the paid orders earn
	Missing       int64 // points the paid orders earn and were not credited
	Redelivered   int   // deliveries after the first, as the consumers counted them
	Note          string
}

var eventTable struct {
	mu   sync.Mutex
	rows []eventRow
}

func reportEvent(r eventRow) {
	eventTable.mu.Lock()
	defer eventTable.mu.Unlock()
	eventTable.rows = append(eventTable.rows, r)
}

func printEventTable(w io.Writer) {
	eventTable.mu.Lock()
	defer eventTable.mu.Unlock()
	if len(eventTable.rows) == 0 {
		return
	}
	table.mu.Lock()
	if len(table.rows) > 0 {
		fmt.Fprintln(w) // below the lock table
	}
	table.mu.Unlock()
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT FAULT\tCONFIG\tEVENTS\tPOINTS DOUBLED\tPOINTS MISSING\tREDELIVERED\tWHAT IT SHOWED")
	for _, r := range eventTable.rows {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\n", r.Fault, r.Config, r.Events, r.Doubled, r.Missing, r.Redelivered, r.Note)
	}
	tw.Flush()
}

// sqlTrap sits between a shop process and MariaDB and stops the line at
// one packet of the client's, or at the server's answer to a COMMIT, to
// let the test freeze or kill the process exactly there.
type sqlTrap struct {
	mu sync.Mutex
	// onStatement, when set, runs (and may block) before a client packet
	// whose SQL contains its needle goes to the server; then it is unset.
	needle      string
	onStatement func()
	// onCommitted, when set, runs once the server has answered the first
	// COMMIT after a packet holding commitAfter on the same connection,
	// before the client sees the answer, which is dropped with the line.
	// (gorm wraps single writes in transactions of their own, and other
	// connections commit meanwhile: not every COMMIT is the effect's.)
	commitAfter string
	onCommitted func()
}

func newSQLTrap(t *testing.T, dsn string) (*sqlTrap, string) {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	trap := &sqlTrap{}
	server := cfg.Addr
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go trap.forward(client, server)
		}
	}()
	cfg.Addr = ln.Addr().String()
	return trap, cfg.FormatDSN()
}

// stopAt makes the next client packet holding needle wait for fn.
func (s *sqlTrap) stopAt(needle string, fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.needle, s.onStatement = needle, fn
}

// killAtCommitAfter makes the answer to the first COMMIT after a packet
// holding needle run fn instead of reaching the client.
func (s *sqlTrap) killAtCommitAfter(needle string, fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.commitAfter, s.onCommitted = needle, fn
}

// take looks at one client packet of a connection whose state is armed
// (a packet holding commitAfter went through it).
func (s *sqlTrap) take(payload []byte, armed *bool) (statement, committed func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// COM_QUERY (0x03) and COM_STMT_PREPARE (0x16) carry the SQL text.
	if len(payload) < 2 || (payload[0] != 0x03 && payload[0] != 0x16) {
		return nil, nil
	}
	sql := string(payload[1:])
	if s.onStatement != nil && strings.Contains(sql, s.needle) {
		statement, s.onStatement = s.onStatement, nil
	}
	if s.onCommitted != nil && strings.Contains(sql, s.commitAfter) {
		*armed = true
	}
	if strings.EqualFold(sql, "ROLLBACK") {
		*armed = false // that write is undone: wait for the next one
	}
	if s.onCommitted != nil && *armed && payload[0] == 0x03 && strings.EqualFold(sql, "COMMIT") {
		committed, s.onCommitted = s.onCommitted, nil
	}
	return statement, committed
}

func (s *sqlTrap) forward(client net.Conn, addr string) {
	server, err := net.Dial("tcp", addr)
	if err != nil {
		client.Close()
		return
	}
	var once sync.Once
	closeBoth := func() { once.Do(func() { client.Close(); server.Close() }) }
	var committed atomic.Pointer[func()]
	go func() { // server to client
		defer closeBoth()
		buf := make([]byte, 32<<10)
		for {
			n, err := server.Read(buf)
			if fn := committed.Swap(nil); fn != nil {
				(*fn)()
				return
			}
			if n > 0 {
				if _, werr := client.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer closeBoth()
	armed := false
	for { // client to server, packet by packet: 3 bytes of length, 1 of sequence
		var head [4]byte
		if _, err := io.ReadFull(client, head[:]); err != nil {
			return
		}
		payload := make([]byte, int(binary.LittleEndian.Uint32(append(head[:3:3], 0))))
		if _, err := io.ReadFull(client, payload); err != nil {
			return
		}
		statement, onCommit := s.take(payload, &armed)
		if statement != nil {
			statement()
		}
		if onCommit != nil {
			committed.Store(&onCommit)
		}
		if _, err := server.Write(append(head[:], payload...)); err != nil {
			return
		}
	}
}

// consumerRig is a database with paid orders, a broker of the test's own
// with their order.paid events, and shop consume processes.
type consumerRig struct {
	t    *testing.T
	bin  string
	dsn  string
	db   *gorm.DB
	nats *testenv.NATSProcess
	js   jetstream.JetStream
	env  map[string]string
}

func newConsumerRig(t *testing.T, env map[string]string) *consumerRig {
	t.Helper()
	r := &consumerRig{t: t, bin: shoptest.Build(t), dsn: shoptest.MySQL(t), nats: testenv.StartNATS(t)}
	db, err := storage.Open(context.Background(), storage.Options{MySQLDSN: r.dsn, MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Migrate(context.Background(), append(order.Models(), append(loyalty.Models(), events.ConsumerModels()...)...)...); err != nil {
		t.Fatal(err)
	}
	r.db = db.DB
	nc, err := nats.Connect(r.nats.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	if r.js, err = jetstream.New(nc); err != nil {
		t.Fatal(err)
	}
	err = events.EnsureStream(context.Background(), r.js, events.StreamOptions{Replicas: 1,
		DuplicateWindow: events.DefaultDuplicateWindow, MaxAge: events.DefaultMaxAge})
	if err != nil {
		t.Fatal(err)
	}
	r.env = map[string]string{
		"SHOP_ENV": "production", "SHOP_JWT_SECRET": shoptest.Random(32), "SHOP_ADMIN_TOKEN": shoptest.Random(32),
		"SHOP_KEY_PREFIX": shoptest.Prefix("faults-consumer"), "SHOP_NATS_URL": r.nats.URL(),
		// Short, so that a paused or killed consumer's message comes back
		// within the test; the lease as short, so that the lock dedup's
		// second holder is granted while the first is frozen.
		"SHOP_EVENTS_ACK_WAIT": "2s", "SHOP_LOCK_TTL": "2s",
		"SHOP_REDIS_ADDRS": shoptest.Env(t, "SHOP_TEST_REDIS_ADDR"),
	}
	for k, v := range env {
		r.env[k] = v
	}
	return r
}

// payOrders inserts n paid orders and publishes their order.paid events,
// as the relay would: ids first..first+n-1, amounts 1000+id cents.
func (r *consumerRig) payOrders(first, n int64) {
	r.t.Helper()
	now := time.Now().UTC().Add(-2 * time.Minute) // past the audit's grace: a missing credit counts
	for id := first; id < first+n; id++ {
		o := order.Order{ID: id, UserID: id%3 + 1, IdempotencyKey: "k" + strconv.FormatInt(id, 10), SKU: "sku", Quantity: 1,
			AmountCents: 1000 + id, Status: order.StatusPaid, CreatedAt: now, PaidAt: &now}
		if err := r.db.Create(&o).Error; err != nil {
			r.t.Fatal(err)
		}
		e := events.Event{ID: events.ID(id, events.TypeOrderPaid), Type: events.TypeOrderPaid, OrderID: id, UserID: o.UserID,
			SKU: o.SKU, Quantity: 1, AmountCents: o.AmountCents, OccurredAt: now}
		b, _ := json.Marshal(e)
		if _, err := r.js.Publish(context.Background(), e.Subject(), b, jetstream.WithMsgID(e.ID)); err != nil {
			r.t.Fatal(err)
		}
	}
}

// start runs shop consume on dsn (the database directly, or a trap).
func (r *consumerRig) start(dsn string) *shoptest.Instance {
	r.t.Helper()
	env := map[string]string{"SHOP_MYSQL_DSN": dsn}
	for k, v := range r.env {
		env[k] = v
	}
	return shoptest.StartCommand(r.t, r.bin, "consume", env)
}

// settled waits until the durable consumer has no message pending or
// unacknowledged.
func (r *consumerRig) settled(n uint64) {
	r.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		c, err := r.js.Consumer(context.Background(), events.Stream, loyalty.ConsumerName)
		if err == nil {
			info, err := c.Info(context.Background())
			if err == nil && info.AckFloor.Stream >= n && info.NumAckPending == 0 && info.NumPending == 0 {
				return
			}
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the consumers did not settle %d messages in 90s", n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// audit returns the points doubled and missing over every paid order.
func (r *consumerRig) audit() (doubled, missing int64) {
	r.t.Helper()
	s := loyalty.NewStore(r.db)
	for _, check := range []struct {
		run func(context.Context) (map[string]int64, error)
		sum *int64
	}{{s.Doubled, &doubled}, {s.Missing, &missing}} {
		by, err := check.run(context.Background())
		if err != nil {
			r.t.Fatal(err)
		}
		for _, v := range by {
			*check.sum += v
		}
	}
	return doubled, missing
}

// metric reads a counter's total from an instance's /metrics.
func metric(t *testing.T, in *shoptest.Instance, name string) int {
	t.Helper()
	res, err := http.Get(in.URL + "/metrics")
	if err != nil {
		return 0
	}
	defer res.Body.Close()
	total := 0.0
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, name+"{") || strings.HasPrefix(line, name+" ") {
			f := strings.Fields(line)
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			total += v
		}
	}
	return int(total)
}

func waitUntil(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 90s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// dedupConfigs are the consumer configurations a fault runs under, with
// whether each is expected to apply every event once.
type dedupConfig struct {
	name string
	env  map[string]string
	once bool
}

func lockDedup(t *testing.T, backend string) map[string]string {
	env := lockEnv(t, backend)
	env["SHOP_EVENTS_DEDUP"] = events.DedupLock
	return env
}

// A consumer SIGKILLed after its effect committed and before its ack: the
// message comes back to the next consumer after AckWait. The inbox and the
// lock's mark, written in the effect's transaction, make that delivery a
// duplicate; without dedup it is applied again.
func TestConsumerKilledAfterCommitBeforeAck(t *testing.T) {
	for _, tc := range []dedupConfig{
		{"dedup=inbox", map[string]string{"SHOP_EVENTS_DEDUP": events.DedupInbox}, true},
		{"dedup=lock (redis, fenced)", lockDedup(t, "redis"), true},
		{"dedup=none", map[string]string{"SHOP_EVENTS_DEDUP": events.DedupNone}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newConsumerRig(t, tc.env)
			trap, trapped := newSQLTrap(t, r.dsn)
			first := r.start(trapped)
			killed := make(chan struct{})
			trap.killAtCommitAfter("INSERT INTO `loyalty_entries`", func() { _ = first.Signal(syscall.SIGKILL); close(killed) })
			const n = 5
			r.payOrders(1, n)
			select {
			case <-killed:
			case <-time.After(60 * time.Second):
				t.Fatal("the first consumer never committed an effect")
			}
			_ = first.Wait(context.Background())
			second := r.start(r.dsn)
			r.settled(n)
			doubled, missing := r.audit()
			redelivered := metric(t, second, "shop_consumer_redeliveries_total")
			wantDoubled := int64(0)
			if !tc.once {
				wantDoubled = loyalty.PointsFor(1000 + 1) // the first order's, applied before the kill and after
			}
			note := fmt.Sprintf("redelivered to the next consumer after AckWait: applied once (%d duplicate skipped)",
				metric(t, second, "shop_consumer_duplicates_total"))
			if !tc.once {
				note = "redelivered and applied again: the first order's points twice"
			}
			reportEvent(eventRow{Fault: "consumer SIGKILLed after commit, before ack", Config: tc.name, Events: n,
				Doubled: doubled, Missing: missing, Redelivered: redelivered, Note: note})
			if doubled != wantDoubled || missing != 0 || redelivered < 1 {
				t.Fatalf("points doubled %d, missing %d, redelivered %d; want doubled %d, missing 0, a redelivery",
					doubled, missing, redelivered, wantDoubled)
			}
		})
	}
}

// A consumer SIGSTOPped inside its effect's transaction, past AckWait and
// past its lock's lease, while a second consumer takes the redelivery and
// applies it; then resumed. The inbox row the first inserted holds the
// second back until the first commits, and its key then refuses the
// second; the fenced mark refuses the first's late write; the unfenced
// lock let both see "not done", and none never looks.
func TestConsumerPausedPastAckWaitWhileAnotherRuns(t *testing.T) {
	for _, tc := range []dedupConfig{
		{"dedup=inbox", map[string]string{"SHOP_EVENTS_DEDUP": events.DedupInbox}, true},
		{"dedup=lock (redis, fenced)", lockDedup(t, "redis"), true},
		{"dedup=lock (memcached, unfenced)", lockDedup(t, "memcached"), false},
		{"dedup=none", map[string]string{"SHOP_EVENTS_DEDUP": events.DedupNone}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newConsumerRig(t, tc.env)
			trap, trapped := newSQLTrap(t, r.dsn)
			first := r.start(trapped)
			frozen, resume := make(chan struct{}), make(chan struct{})
			var resumed sync.Once
			resumeFirst := func() { resumed.Do(func() { _ = first.Signal(syscall.SIGCONT); close(resume) }) }
			// Run before the database's cleanup: a first left frozen inside
			// its transaction would hold that cleanup's DROP for ever.
			t.Cleanup(resumeFirst)
			trap.stopAt("INSERT INTO `loyalty_entries`", func() {
				_ = first.Signal(syscall.SIGSTOP)
				close(frozen)
				<-resume // the first's statement goes on only once it is resumed
			})
			r.payOrders(1, 1)
			select {
			case <-frozen:
			case <-time.After(60 * time.Second):
				t.Fatal("the first consumer never reached its effect")
			}
			second := r.start(r.dsn)
			if tc.env["SHOP_EVENTS_DEDUP"] == events.DedupInbox {
				// The second waits on the first's inbox row: it can only
				// have taken the message.
				waitUntil(t, "the redelivery reaches the second consumer", func() bool {
					return metric(t, second, "shop_consumer_messages_total") >= 1
				})
				time.Sleep(time.Second)
			} else {
				waitUntil(t, "the second consumer applies the redelivery", func() bool {
					return metric(t, second, "shop_consumer_applied_total") >= 1
				})
			}
			resumeFirst()
			r.settled(1)
			// The first's late write, if any, lands within its transaction:
			// wait until it has handled its message.
			// "effect failed": an unfenced holder's write landed after its
			// lease ran out (lockkit.ErrLeaseLost), and it naked.
			waitUntil(t, "the resumed consumer finishes its message", func() bool {
				return metric(t, first, "shop_consumer_applied_total")+metric(t, first, "shop_consumer_fenced_total")+
					metric(t, first, "shop_consumer_duplicates_total") >= 1 || strings.Contains(first.Logs(), "effect failed")
			})
			doubled, missing := r.audit()
			fenced := metric(t, first, "shop_consumer_fenced_total")
			redelivered := metric(t, first, "shop_consumer_redeliveries_total") + metric(t, second, "shop_consumer_redeliveries_total")
			wantDoubled := int64(0)
			if !tc.once {
				wantDoubled = loyalty.PointsFor(1000 + 1)
			}
			note := map[string]string{
				"dedup=inbox":                      "the second waited on the first's inbox row, then hit its key: applied once",
				"dedup=lock (redis, fenced)":       fmt.Sprintf("the resumed holder's write refused by the fenced mark (%d fenced): applied once", fenced),
				"dedup=lock (memcached, unfenced)": "both holders saw \"not done\"; the resumed one's write landed after its lease: applied twice",
				"dedup=none":                       "applied by both: twice",
			}[tc.name]
			reportEvent(eventRow{Fault: "consumer SIGSTOPped past AckWait, another runs", Config: tc.name, Events: 1,
				Doubled: doubled, Missing: missing, Redelivered: redelivered, Note: note})
			if doubled != wantDoubled || missing != 0 {
				t.Fatalf("points doubled %d, missing %d; want doubled %d, missing 0", doubled, missing, wantDoubled)
			}
		})
	}
}
