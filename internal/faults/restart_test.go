package faults

import (
	"context"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit/registry"
	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/shoptest"
)

// restartBackends are the backends fault 3 restarts the server of: every
// one that excludes across processes, but redlock, whose three masters are
// not one server to restart. The mysql backends keep their locks in the
// shop's own database, so their shop processes use the private MariaDB for
// everything.
func restartBackends() []registry.Backend {
	var out []registry.Backend
	for _, b := range registry.CrossProcess() {
		if b.Server.Kind != registry.Redlock {
			out = append(out, b)
		}
	}
	return out
}

// TestLockServerRestart is fault 3: under a steady load of deposits from two
// shop processes, the lock server is stopped, left down for a while and
// started again. The short form restarts Redis; SHOP_FAULTS=full every kind.
func TestLockServerRestart(t *testing.T) {
	for _, b := range restartBackends() {
		t.Run(b.Name, func(t *testing.T) {
			if b.Name != "redis" {
				needFull(t)
			}
			t.Parallel()
			restartFault(t, b.Name, b.Server.Kind)
		})
	}
	// Redis without persistence forgets the fence counters and the grants:
	// tokens floored at the server's clock still rise, so a holder from
	// before the restart is refused and the new holders are not.
	t.Run("redis-volatile", func(t *testing.T) {
		needFull(t)
		t.Parallel()
		restartFault(t, "redis", "redis-volatile")
	})
}

// restartDown is how long the server stays down: longer than the lock wait
// timeout, so that requests cannot simply wait the outage out.
const restartDown = 4 * time.Second

func restartFault(t *testing.T, backend, kind string) {
	srv := newServer(t, kind, "127.0.0.1")
	r := newRig(t, restartEnv(t, srv, backend, kind))
	a, b := r.start(), r.start()
	const id = 1
	r.account(a.URL, id, opening)
	tok := r.token(id)
	load := startDepositLoad(t, r, []string{a.URL, b.URL}, tok, id)

	time.Sleep(1500 * time.Millisecond)
	var stale *staleWriter
	if kind == "redis-volatile" {
		stale = newStaleWriter(t, r, a.URL, srv.addr, id+1)
	}
	var w outage
	w.downAt = time.Now()
	srv.stop(syscall.SIGTERM)
	w.stopped = time.Now()
	time.Sleep(restartDown)
	w.restarting = time.Now()
	srv.start()
	w.upAt = time.Now()

	// Load continues until the service has answered 200 again for a while.
	recovered := load.awaitRecovery(w.upAt, 90*time.Second)
	load.stop()
	r.hist.do(context.Background(), r.client, a.URL, tok, id, accInput{Kind: "get"})

	tl := tallyOutcomes(load.outcomes, w)
	audit := r.audit(a.URL)
	lin, verdict := r.hist.check(id)
	lost := audit.BalanceDrift.ByAccount["1"]
	res := row{Fault: "3 restart (" + kind + ")", Backend: backend, LostCents: lost, Linearizable: verdict, Fenced: tl.refused["fenced"],
		Stale: fmt.Sprintf("%d ok, 503: %s, outcome unknown: %d, other: %d", tl.ok, counts(tl.refused), tl.unknown, tl.bad)}
	if !recovered.IsZero() {
		res.Recovery = recovered.Sub(w.upAt)
	}
	if stale != nil {
		res.Stale += stale.verify(t, r, a.URL)
	}
	report(res)
	t.Logf("%+v (down %v, stop took %v)", res, w.upAt.Sub(w.downAt).Round(time.Millisecond), w.stopped.Sub(w.downAt).Round(time.Millisecond))

	tl.check(t, kind, recovered)
	if tl.bad != 0 || !lin {
		logFailedRequests(t, a, b)
	}
	if fences(backend) && (lost != 0 || !lin) {
		t.Errorf("restart lost updates: drift %d, linearizable %s\n%s", lost, verdict, r.hist.describe(id))
	}
	if (lost == 0) != lin {
		t.Errorf("audit drift %d and history check %s disagree", lost, verdict)
	}
}

// restartEnv is the environment of the shop processes that use srv, the
// server of kind, through backend. A MariaDB server gets a database of
// its own for everything the shop stores.
func restartEnv(t *testing.T, srv *server, backend, kind string) map[string]string {
	env := map[string]string{
		"SHOP_LOCK_BACKEND": backend,
		// A request waits at most this long for a lock before 503, so
		// that a request cannot outwait the outage and hide it.
		"SHOP_LOCK_WAIT_TIMEOUT":      "1s",
		"SHOP_LOCK_TTL":               holderTTL.String(),
		"SHOP_CRITICAL_SECTION_DELAY": "20ms",
	}
	reg, _ := registry.Lookup(backend)
	if kind != registry.MariaDB {
		env[reg.Server.Setting] = srv.addr
		return env
	}
	root, err := sqlOpen(srv.dsn(""))
	if err != nil {
		t.Fatal(err)
	}
	_, err = root.Exec("CREATE DATABASE shop_faults")
	root.Close()
	if err != nil {
		t.Fatal(err)
	}
	env["SHOP_MYSQL_DSN"] = srv.dsn("shop_faults")
	return env
}

// outage is when the server was told to stop, had stopped, was started
// again and was ready.
type outage struct {
	downAt, stopped, restarting, upAt time.Time
}

// loadResult is one request of the load, and whether it was a write.
type loadResult struct {
	outcome
	write bool
}

// depositLoad is four clients depositing on one account, and reading it
// every fifth request, through the shop processes in turn, until stopped.
type depositLoad struct {
	mu       sync.Mutex
	outcomes []loadResult
	done     chan struct{}
	wg       sync.WaitGroup
}

func startDepositLoad(t *testing.T, r *rig, urls []string, tok string, id int64) *depositLoad {
	l := &depositLoad{done: make(chan struct{})}
	for w := range 4 {
		url := urls[w%len(urls)]
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			l.client(r, url, tok, id, int64(w+1))
		}()
	}
	t.Cleanup(l.stop)
	return l
}

// client deposits amount at a time, reading every fifth request.
func (l *depositLoad) client(r *rig, url, tok string, id, amount int64) {
	for i := 0; ; i++ {
		select {
		case <-l.done:
			return
		default:
		}
		in := accInput{Kind: "deposit", Amount: amount}
		if i%5 == 4 {
			in = accInput{Kind: "get"}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		o := r.hist.do(ctx, r.client, url, tok, id, in)
		cancel()
		l.mu.Lock()
		l.outcomes = append(l.outcomes, loadResult{o, in.Kind != "get"})
		l.mu.Unlock()
		if o.Status != http.StatusOK {
			time.Sleep(50 * time.Millisecond) // a client backing off, not spinning
		}
	}
}

// stop stops the clients and waits for them; it may be called again.
func (l *depositLoad) stop() {
	select {
	case <-l.done:
	default:
		close(l.done)
		l.wg.Wait()
	}
}

// awaitRecovery waits, at most until upAt+limit, for the first write
// since upAt to have succeeded more than a second ago, and returns when it
// returned (zero if none did).
func (l *depositLoad) awaitRecovery(upAt time.Time, limit time.Duration) time.Time {
	var recovered time.Time
	deadline := upAt.Add(limit)
	for time.Now().Before(deadline) {
		l.mu.Lock()
		for _, o := range l.outcomes {
			if o.write && o.Status == http.StatusOK && o.Call.After(upAt) && (recovered.IsZero() || o.Return.Before(recovered)) {
				recovered = o.Return
			}
		}
		l.mu.Unlock()
		if !recovered.IsZero() && time.Since(recovered) > time.Second {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return recovered
}

// tally counts the load's answers by kind.
type tally struct {
	ok, okDuring, unknown, bad int
	refused                    map[string]int // by problem type
	bads                       []string       // the first few bad answers
}

func tallyOutcomes(outcomes []loadResult, w outage) tally {
	tl := tally{refused: map[string]int{}}
	for _, o := range outcomes {
		switch {
		case o.Err == nil && o.Status == http.StatusOK:
			tl.ok++
			// Reads take no lock; a write must not succeed without one.
			if o.write && o.Call.After(w.stopped) && o.Return.Before(w.restarting) {
				tl.okDuring++
			}
		case problem503(o.outcome) && o.refused():
			tl.refused[o.Type]++
		case problem503(o.outcome) && o.Type == "outcome-unknown":
			// The database went away between a COMMIT and its reply: the
			// service cannot know, and says so; the history places the
			// deposit either way.
			tl.unknown++
		default:
			tl.bad++
			if len(tl.bads) < 5 {
				tl.bads = append(tl.bads, o.String())
			}
		}
	}
	return tl
}

// problem503 is a 503 answer with a problem+json body.
func problem503(o outcome) bool {
	return o.Err == nil && o.Status == http.StatusServiceUnavailable && strings.HasPrefix(o.ContentType, problem.ContentType)
}

// check: the outage was seen and refused, no write ran without the lock,
// every answer was one the service may give, and the service recovered
// by itself.
func (tl tally) check(t *testing.T, kind string, recovered time.Time) {
	t.Helper()
	if kind == "redis-volatile" && tl.refused["fenced"] != 0 {
		t.Errorf("%d writes of live holders refused as stale: the restarted server's tokens went back", tl.refused["fenced"])
	}
	if recovered.IsZero() {
		t.Errorf("no request succeeded within 90s of the %s restart: the service did not recover by itself", kind)
	}
	if tl.okDuring != 0 {
		t.Errorf("%d requests succeeded while %s was down: they ran without the lock", tl.okDuring, kind)
	}
	if len(tl.refused) == 0 {
		t.Errorf("no request was refused while %s was down; the outage went unseen", kind)
	}
	if tl.bad != 0 {
		t.Errorf("%d answers were neither 200, a 503 problem+json that changed nothing, nor one that says the outcome is unknown, e.g. %s",
			tl.bad, strings.Join(tl.bads, "; "))
	}
}

// logFailedRequests logs the service's own account of its failed
// requests: the body hides a 500's cause, and a 503 that changed something
// shows only as a history without a linearization. A refused dial, the
// bulk of an outage's 503s, changed nothing.
func logFailedRequests(t *testing.T, instances ...*shoptest.Instance) {
	t.Helper()
	for _, in := range instances {
		for line := range strings.Lines(in.Logs()) {
			if strings.Contains(line, `"msg":"request failed"`) && !strings.Contains(line, "connect: connection refused") {
				t.Logf("%s: %s", in.URL, line)
			}
		}
	}
}

func counts(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
