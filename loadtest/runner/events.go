package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/loyalty"
	"github.com/lockbench/shop/loadtest/runner/report"
)

// eventsRows are the rows of the ways events leave shop and are applied:
// the defaults first, then each other way beside them.
var eventsRows = []string{"events", "events-lock", "events-none", "events-direct"}

// The events rows' settings. The orders flow runs at eventsRate/5
// iterations a second (each a place, most a pay: some 30 events a
// second), unless -rate is given.
const (
	eventsRate = 60
	consumers  = 2
	// ackWait is SHOP_EVENTS_ACK_WAIT: short, so that a consumer paused
	// past it is redelivered within the run.
	ackWait = 2 * time.Second
	// leaseTTL is SHOP_LOCK_TTL: a killed relay leader's lease runs out
	// within the run, not after the default 30 s.
	leaseTTL = 5 * time.Second
)

// eventsSpec is an events row: the orders flow alone (its changes are
// the events), on the redis lock, with one way of delivery and dedup.
func eventsSpec(name string) (report.Row, bool) {
	row := func(delivery, dedup string, expect report.Expectation, why string) (report.Row, bool) {
		return report.Row{Name: name, Backend: "redis", Strategy: "lock", Flows: []string{"orders"}, Expect: expect,
			Why: why, Delivery: delivery, Dedup: dedup}, true
	}
	switch name {
	case "events":
		return row(report.DeliveryOutbox, report.DedupInbox, report.ExpectClean,
			"the defaults: the event commits with its change, the dedup record with its effect")
	case "events-lock":
		return row(report.DeliveryOutbox, report.DedupLock, report.ExpectClean,
			"a redis lock on the event id, its done-mark claimed with the lock's fencing token")
	case "events-none":
		return row(report.DeliveryOutbox, report.DedupNone, report.ExpectDamage,
			"no dedup: a redelivery applies again")
	case "events-direct":
		return row(report.DeliveryDirect, report.DedupInbox, report.ExpectDamage,
			"publish after commit: what is committed while the broker is away never leaves")
	}
	return report.Row{}, false
}

// eventsEnv are an events row's SHOP_* settings, beside shopEnv's.
func eventsEnv(s report.Row, natsURL string) []string {
	return []string{
		"SHOP_NATS_URL=" + natsURL,
		"SHOP_EVENTS_DELIVERY=" + s.Delivery,
		"SHOP_EVENTS_DEDUP=" + s.Dedup,
		"SHOP_EVENTS_CONSUME_IN_SERVE=false",
		"SHOP_EVENTS_ACK_WAIT=" + ackWait.String(),
		"SHOP_LOCK_TTL=" + leaseTTL.String(),
	}
}

// eventRig is an events row's broker, its `shop consume` processes and
// the runner's own connection to the broker, which it reads the durable
// consumer's state and the stream through.
type eventRig struct {
	broker    *broker
	consumers []*instance
	nc        *nats.Conn
	js        jetstream.JetStream
}

// startEvents starts the row's broker; its consumers start once the
// instances have migrated the database (startConsumers).
func (r *row) startEvents(ctx context.Context) error {
	b, err := startBroker(ctx, r.env.natsServer, r.logPath("nats"))
	if err != nil {
		return err
	}
	r.cleanups = append(r.cleanups, b.stop)
	// The runner's connection outlives the broker's restart.
	nc, err := nats.Connect(b.url(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return err
	}
	r.cleanups = append(r.cleanups, nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	r.events = &eventRig{broker: b, nc: nc, js: js}
	return nil
}

// startConsumers starts the `shop consume` processes, at a port of their
// own each (their probes and /metrics).
func (r *row) startConsumers(ctx context.Context) error {
	return r.startReady(ctx, "consume", "consume", consumers, &r.events.consumers)
}

// faults is what an events row does to its processes while k6 places
// orders, one after the other, each from a fixed share of the phase:
//
//  1. a consumer is stopped inside a paid event's effect past its ack
//     wait, then goes on (a GC or VM pause): the event is delivered again
//     after it was applied, for certain (pauseConsumer);
//  2. the broker restarts: what direct delivery loses for certain, every
//     publish of a change committed while it is away;
//  3. the relay's leader is SIGKILLed and restarted: a lease it held stays
//     until it runs out, and a batch published and not yet marked is
//     republished by the next leader;
//  4. the other consumer is SIGKILLed and restarted: what it held
//     unacknowledged is redelivered.
//
// It returns what it did, for the report; a step that failed says so,
// and the next runs.
func (r *row) faults(ctx context.Context) []string {
	phase := r.o.Duration
	db, err := r.db.open()
	if err != nil {
		return []string{"no fault made: " + err.Error()}
	}
	defer db.Close()
	began := time.Now()
	at := func(share float64) { sleepCtx(ctx, time.Until(began.Add(time.Duration(share*float64(phase))))) }
	var done []string
	note := func(err error, format string, args ...any) {
		what := fmt.Sprintf(format, args...)
		if err != nil {
			what += fmt.Sprintf(" (failed: %v)", err)
		}
		r.log.Info("fault", "row", r.spec.Name, "at", time.Since(began).Round(100*time.Millisecond), "what", what)
		done = append(done, what)
	}
	rig := r.events
	at(0.1)
	what, err := rig.pauseConsumer(ctx, db, r.db.name)
	note(err, "%s", orString(what, "consume1 not paused"))
	at(0.4)
	away, err := rig.broker.restart(ctx)
	note(err, "broker restarted (away %s)", away.Round(100*time.Millisecond))
	at(0.55)
	if r.spec.Delivery == report.DeliveryDirect {
		i := r.publisher(ctx)
		r.instances[i], err = r.instances[i].restart(ctx)
		note(err, "shop%d, publishing after its commits, SIGKILLed and restarted", i+1)
	} else {
		what, err := r.killLeaderBeforeItsMark(ctx, db)
		note(err, "%s", orString(what, "relay leader not killed"))
	}
	at(0.7)
	rig.consumers[1], err = rig.consumers[1].restart(ctx)
	note(err, "consume2 SIGKILLed and restarted")
	return done
}

func orString(s, alt string) string {
	if s == "" {
		return alt
	}
	return s
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// killLeaderBeforeItsMark SIGKILLs the relay's leader after the broker
// acknowledged a batch and before the leader marked it published, the
// window that makes the outbox publish an event twice. The runner locks
// the oldest unpublished outbox rows (by primary key: new rows are still
// written) until the leader's mark waits for them; the instance that
// holds the waiting session's connection is the leader. Killed, it leaves
// its lease to run out (SHOP_LOCK_TTL) and its batch unmarked: the next
// leader publishes it again, and the broker's deduplication absorbs the
// copies (republished). It is restarted. The rows are held at most a
// second at a time: a relay that got past them is caught at its next
// batch.
func (r *row) killLeaderBeforeItsMark(ctx context.Context, db *sql.DB) (string, error) {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		i, err := r.catchLeaderMarking(ctx, db)
		if err != nil {
			return "", err
		}
		if i >= 0 {
			r.instances[i], err = r.instances[i].restart(ctx)
			return fmt.Sprintf("relay leader shop%d SIGKILLed between the broker's ack and its mark, and restarted", i+1), err
		}
	}
	return "", errors.New("no relay leader caught marking within 15 s")
}

// catchLeaderMarking holds the oldest unpublished outbox rows for up to a
// second; if a mark waits for them, it kills the instance marking (before
// letting the rows go, so that its mark never lands) and returns its
// index, else -1.
func (r *row) catchLeaderMarking(ctx context.Context, db *sql.DB) (int, error) {
	seqs, err := column[any](ctx, db, `SELECT seq FROM event_outbox WHERE published_at IS NULL ORDER BY seq LIMIT 16`)
	if err != nil || len(seqs) == 0 {
		sleepCtx(ctx, 50*time.Millisecond)
		return -1, err
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return -1, err
	}
	defer tx.Rollback() // lets the rows go, after a kill
	marks := strings.TrimSuffix(strings.Repeat("?,", len(seqs)), ",")
	if _, err := tx.ExecContext(ctx, "SELECT seq FROM event_outbox WHERE seq IN ("+marks+") FOR UPDATE", seqs...); err != nil {
		return -1, err
	}
	port, ok := waitingClient(ctx, db, r.db.name, time.Second)
	if !ok {
		return -1, nil
	}
	for i, in := range r.instances {
		if ownsLocalPort(in.pid(), port) {
			in.kill()
			return i, nil
		}
	}
	return -1, nil
}

// waitingClient is the client port of a session of database dbName that
// marks outbox rows published and has been at it for more than 50 ms,
// waited for up to timeout: a mark takes a few milliseconds, unless it
// waits for the rows the runner holds.
func waitingClient(ctx context.Context, db *sql.DB, dbName string, timeout time.Duration) (int, bool) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var host string
		err := db.QueryRowContext(ctx, `SELECT HOST FROM information_schema.PROCESSLIST
			WHERE DB = ? AND INFO LIKE 'UPDATE %event_outbox% SET %published_at%' AND TIME_MS > 50 LIMIT 1`, dbName).Scan(&host)
		if err == nil {
			_, p, _ := strings.Cut(host, ":")
			port, err := strconv.Atoi(p)
			return port, err == nil
		}
		sleepCtx(ctx, 5*time.Millisecond)
	}
	return 0, false
}

// publisher is the index of the instance that published last: the one
// whose shop_events_published_total grew the most in half a second, else
// the one that published most. The relay's leader holds its lease for one
// drain of the outbox at a time, so under load it is the one publishing.
func (r *row) publisher(ctx context.Context) int {
	first := r.publishedCounts(ctx)
	sleepCtx(ctx, 500*time.Millisecond)
	return busiest(first, r.publishedCounts(ctx))
}

// busiest is the index whose count grew most from before to after, else
// the largest after; 0 when nothing was counted.
func busiest(before, after []float64) int {
	best, bestGrowth, bestTotal := 0, 0.0, 0.0
	for i := range after {
		growth := after[i] - before[i]
		if growth > bestGrowth || (bestGrowth == 0 && growth == 0 && after[i] > bestTotal) {
			best, bestGrowth, bestTotal = i, growth, after[i]
		}
	}
	return best
}

// publishedCounts are the instances' shop_events_published_total, stored
// and duplicate; an instance that does not answer counts 0.
func (r *row) publishedCounts(ctx context.Context) []float64 {
	out := make([]float64, len(r.instances))
	for i, in := range r.instances {
		out[i], _ = scrapeSum(ctx, in.url, "shop_events_published_total", "")
	}
	return out
}

// republished is the publishes the broker acknowledged as duplicates,
// summed over the instances (a restarted one counts from its restart).
func (r *row) republished(ctx context.Context) int64 {
	var n float64
	for _, in := range r.instances {
		v, _ := scrapeSum(ctx, in.url, "shop_events_published_total", `result="duplicate"`)
		n += v
	}
	return int64(n)
}

// pauseConsumer makes a repeated delivery of an applied event certain,
// by stopping consume1 inside a paid event's effect:
//
//  1. consume2 is stopped (SIGSTOP), so that consume1 alone takes the
//     messages;
//  2. the runner locks the credits' table (LOCK TABLES ... WRITE), so
//     that consume1's next paid event blocks at its credit's INSERT, inside
//     its transaction, which the server's process list shows;
//  3. consume1 is stopped there, the table unlocked (the INSERT completes
//     on the server; the transaction stays open) and consume2 let go on;
//  4. past the ack wait JetStream hands the event to consume2, which
//     applies it, or finds it applied, or waits for consume1's
//     uncommitted dedup record;
//  5. consume1 goes on and commits: without dedup the credit is doubled;
//     with it, one of the two deliveries is turned away.
//
// It returns what happened, for the report.
func (rig *eventRig) pauseConsumer(ctx context.Context, db *sql.DB, dbName string) (string, error) {
	a, b := rig.consumers[0], rig.consumers[1]
	b.signal(syscall.SIGSTOP)
	defer b.signal(syscall.SIGCONT) // also when a step failed
	conn, err := db.Conn(ctx)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "LOCK TABLES loyalty_entries WRITE"); err != nil {
		return "", err
	}
	waiting := rig.waitForWriter(ctx, db, dbName, 10*time.Second)
	a.signal(syscall.SIGSTOP)
	defer a.signal(syscall.SIGCONT)
	if _, err := conn.ExecContext(ctx, "UNLOCK TABLES"); err != nil {
		return "", err
	}
	if !waiting {
		return "", errors.New("no paid event reached consume1 in 10 s")
	}
	b.signal(syscall.SIGCONT)
	sleepCtx(ctx, ackWait+time.Second)
	return fmt.Sprintf("consume1 stopped inside a paid event's effect for %s (past its ack wait), then went on", ackWait+time.Second), nil
}

// waitForWriter waits until a session of database dbName waits for the
// table lock, and reports whether one did within timeout.
func (rig *eventRig) waitForWriter(ctx context.Context, db *sql.DB, dbName string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		var n int
		err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = ? AND STATE LIKE 'Waiting for table%lock'`, dbName).Scan(&n)
		if err == nil && n > 0 {
			return true
		}
		sleepCtx(ctx, 5*time.Millisecond)
	}
	return false
}

func (rig *eventRig) consumerInfo(ctx context.Context) (*jetstream.ConsumerInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := rig.js.Consumer(ctx, events.Stream, loyalty.ConsumerName)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// redeliveries are the durable consumer's deliveries beyond a message's
// first: its consumer sequence counts every delivery, its stream sequence
// the messages delivered (every message of the stream is for it).
func (rig *eventRig) redeliveries(ctx context.Context) (int64, error) {
	info, err := rig.consumerInfo(ctx)
	if err != nil {
		return 0, err
	}
	return int64(info.Delivered.Consumer) - int64(info.Delivered.Stream), nil
}

// settleEvents waits for the row's events to drain and measures them.
func (r *row) settleEvents(ctx context.Context, faults []string) (*report.Events, error) {
	db, err := r.db.open()
	if err != nil {
		return nil, err
	}
	defer db.Close()
	took, err := r.drain(ctx, db)
	if err != nil {
		return nil, err
	}
	e, err := r.measureEvents(ctx, db)
	if err != nil {
		return nil, err
	}
	e.Faults, e.DrainSeconds = faults, took.Seconds()
	return &e, nil
}
