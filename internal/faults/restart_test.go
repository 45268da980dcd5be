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
	env := map[string]string{
		"SHOP_LOCK_BACKEND": backend,
		// A request waits at most this long for a lock before 503, so
		// that a request cannot outwait the outage and hide it.
		"SHOP_LOCK_WAIT_TIMEOUT":      "1s",
		"SHOP_LOCK_TTL":               holderTTL.String(),
		"SHOP_CRITICAL_SECTION_DELAY": "20ms",
	}
	reg, _ := registry.Lookup(backend)
	switch kind {
	default:
		env[reg.Server.Setting] = srv.addr
	case registry.MariaDB:
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
	}
	r := newRig(t, env)
	a, b := r.start(), r.start()
	const id = 1
	r.account(a.URL, id, opening)
	tok := r.token(id)

	type result struct {
		outcome
		write bool
	}
	var (
		mu       sync.Mutex
		outcomes []result
		stopLoad = make(chan struct{})
		wg       sync.WaitGroup
	)
	for w := range 4 {
		url := []string{a.URL, b.URL}[w%2]
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stopLoad:
					return
				default:
				}
				in := accInput{Kind: "deposit", Amount: int64(w + 1)}
				if i%5 == 4 {
					in = accInput{Kind: "get"}
				}
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				o := r.hist.do(ctx, r.client, url, tok, id, in)
				cancel()
				mu.Lock()
				outcomes = append(outcomes, result{o, in.Kind != "get"})
				mu.Unlock()
				if o.Status != http.StatusOK {
					time.Sleep(50 * time.Millisecond) // a client backing off, not spinning
				}
			}
		}()
	}
	stopAll := func() {
		select {
		case <-stopLoad:
		default:
			close(stopLoad)
			wg.Wait()
		}
	}
	t.Cleanup(stopAll)

	time.Sleep(1500 * time.Millisecond)
	var stale *staleWriter
	if kind == "redis-volatile" {
		stale = newStaleWriter(t, r, a.URL, srv.addr, id+1)
	}
	downAt := time.Now()
	srv.stop(syscall.SIGTERM)
	stopped := time.Now()
	time.Sleep(restartDown)
	restarting := time.Now()
	srv.start()
	upAt := time.Now()

	// Load continues until the service has answered 200 again for a while.
	var recovered time.Time
	deadline := upAt.Add(90 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		for _, o := range outcomes {
			if o.write && o.Status == http.StatusOK && o.Call.After(upAt) && (recovered.IsZero() || o.Return.Before(recovered)) {
				recovered = o.Return
			}
		}
		mu.Unlock()
		if !recovered.IsZero() && time.Since(recovered) > time.Second {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopAll()
	r.hist.do(context.Background(), r.client, a.URL, tok, id, accInput{Kind: "get"})

	var okDuring, ok, unknown, bad int
	refused := map[string]int{}
	var bads []string
	for _, o := range outcomes {
		switch {
		case o.Err == nil && o.Status == http.StatusOK:
			ok++
			// Reads take no lock; a write must not succeed without one.
			if o.write && o.Call.After(stopped) && o.Return.Before(restarting) {
				okDuring++
			}
		case o.Err == nil && o.Status == http.StatusServiceUnavailable && o.refused() &&
			strings.HasPrefix(o.ContentType, problem.ContentType):
			refused[o.Type]++
		case o.Err == nil && o.Status == http.StatusServiceUnavailable && o.Type == "outcome-unknown" &&
			strings.HasPrefix(o.ContentType, problem.ContentType):
			// The database went away between a COMMIT and its reply: the
			// service cannot know, and says so; the history places the
			// deposit either way.
			unknown++
		default:
			bad++
			if len(bads) < 5 {
				bads = append(bads, o.String())
			}
		}
	}
	audit := r.audit(a.URL)
	lin, verdict := r.hist.check(id)
	lost := audit.BalanceDrift.ByAccount["1"]
	res := row{Fault: "3 restart (" + kind + ")", Backend: backend, LostCents: lost, Linearizable: verdict, Fenced: refused["fenced"],
		Stale: fmt.Sprintf("%d ok, 503: %s, outcome unknown: %d, other: %d", ok, counts(refused), unknown, bad)}
	if !recovered.IsZero() {
		res.Recovery = recovered.Sub(upAt)
	}
	if stale != nil {
		res.Stale += stale.verify(t, r, a.URL)
	}
	report(res)
	t.Logf("%+v (down %v, stop took %v)", res, upAt.Sub(downAt).Round(time.Millisecond), stopped.Sub(downAt).Round(time.Millisecond))

	if kind == "redis-volatile" && refused["fenced"] != 0 {
		t.Errorf("%d writes of live holders refused as stale: the restarted server's tokens went back", refused["fenced"])
	}
	if recovered.IsZero() {
		t.Errorf("no request succeeded within 90s of the %s restart: the service did not recover by itself", kind)
	}
	if okDuring != 0 {
		t.Errorf("%d requests succeeded while %s was down: they ran without the lock", okDuring, kind)
	}
	if len(refused) == 0 {
		t.Errorf("no request was refused while %s was down; the outage went unseen", kind)
	}
	if bad != 0 {
		t.Errorf("%d answers were neither 200, a 503 problem+json that changed nothing, nor one that says the outcome is unknown, e.g. %s",
			bad, strings.Join(bads, "; "))
	}
	if bad != 0 || !lin {
		// The body hides a 500's cause, and a 503 that changed something
		// shows only as a history without a linearization; the service's
		// log names both causes. A refused dial, the bulk of an outage's
		// 503s, changed nothing.
		for _, in := range []*shoptest.Instance{a, b} {
			for line := range strings.Lines(in.Logs()) {
				if strings.Contains(line, `"msg":"request failed"`) && !strings.Contains(line, "connect: connection refused") {
					t.Logf("%s: %s", in.URL, line)
				}
			}
		}
	}
	if fences(backend) && (lost != 0 || !lin) {
		t.Errorf("restart lost updates: drift %d, linearizable %s\n%s", lost, verdict, r.hist.describe(id))
	}
	if (lost == 0) != lin {
		t.Errorf("audit drift %d and history check %s disagree", lost, verdict)
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
