package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/shoptest"
)

// TestGracefulShutdown starts the binary on the embedded defaults, starts
// a withdrawal that spends 2 s in its critical section, and sends SIGTERM
// while it holds the lock: the request still completes 200, the process
// exits 0, and nothing drifted.
func TestGracefulShutdown(t *testing.T) {
	bin := shoptest.Build(t)
	secret, admin := shoptest.Random(32), shoptest.Random(16)
	dbPath := t.TempDir() + "/shop.db"
	env := map[string]string{
		"SHOP_ENV": "production", "SHOP_JWT_SECRET": secret, "SHOP_ADMIN_TOKEN": admin,
		"SHOP_SQLITE_PATH": dbPath, "SHOP_CRITICAL_SECTION_DELAY": "2s",
		"SHOP_NATS_URL": "", // make run's embedded broker stops with it
	}
	in := shoptest.Start(t, bin, env)
	client := shoptest.NewClient(4)
	defer client.Close()
	client.Must(t, http.StatusOK, "POST", in.URL+"/admin/v1/reset", admin, nil)
	tok := shoptest.Token(t, secret, 1)

	type result struct {
		r   shoptest.Response
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := client.Do(context.Background(), "POST", in.URL+"/api/v1/accounts/1/withdraw", tok, `{"amount_cents":100}`)
		done <- result{r, err}
	}()
	// The request holds the lock once an account-class acquisition is
	// counted; from then on it sleeps in its critical section.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := client.Must(t, http.StatusOK, "GET", in.URL+"/metrics", "", nil)
		if strings.Contains(string(r.Body), `shop_lock_wait_seconds_count{backend="redis",class="account"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the withdrawal never took its lock")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err := in.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}

	res := <-done
	if res.err != nil || res.r.Status != http.StatusOK {
		t.Fatalf("in-flight withdrawal: %v %d %s; want 200", res.err, res.r.Status, res.r.Body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := in.Wait(ctx); err != nil {
		t.Fatalf("exit: %v, want status 0\n%s", err, in.Logs())
	}
	if !strings.Contains(in.Logs(), `"msg":"stopped"`) {
		t.Errorf("no clean stop in the logs:\n%s", in.Logs())
	}

	// The database outlived the process: a new one on the same file sees
	// the withdrawal, takes new ones (its embedded Redis restarted the
	// fence tokens; the rows' fences were forgotten), and no drift.
	env["SHOP_CRITICAL_SECTION_DELAY"] = "0"
	again := shoptest.Start(t, bin, env)
	var a struct {
		Balance int64 `json:"balance_cents"`
	}
	client.Must(t, http.StatusOK, "GET", again.URL+"/api/v1/accounts/1", tok, nil).JSON(t, &a)
	if a.Balance != 100_000-100 {
		t.Errorf("balance %d after restart, want %d", a.Balance, 100_000-100)
	}
	client.Must(t, http.StatusOK, "POST", again.URL+"/api/v1/accounts/1/withdraw", tok, `{"amount_cents":100}`)
	var audit struct{ OK bool }
	client.Must(t, http.StatusOK, "GET", again.URL+"/admin/v1/audit", admin, nil).JSON(t, &audit)
	if !audit.OK {
		t.Error("audit not ok after the shutdown")
	}
}

// syncBuffer is a log sink that serve's logger and the test share.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// serveInProcess runs serve with vars in a goroutine and returns its base
// URL, its logs, the function that stops it (SIGTERM) and a channel
// closed when serve has returned, with its result.
func serveInProcess(t *testing.T, vars map[string]string) (base string, logs *syncBuffer, stop func(), served *serveResult) {
	t.Helper()
	// /metrics on the API listener unless the test says otherwise: the
	// default loopback port would be shared by every test process.
	vars = maps.Clone(vars)
	if _, ok := vars["SHOP_METRICS_ADDR"]; !ok {
		vars["SHOP_METRICS_ADDR"] = vars["SHOP_HTTP_ADDR"]
	}
	cfg, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	logs = &syncBuffer{}
	ctx, cancel := context.WithCancel(context.Background())
	served = &serveResult{done: make(chan struct{})}
	go func() {
		served.err = serve(ctx, cfg, slog.New(slog.NewJSONHandler(logs, nil)))
		close(served.done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-served.done:
		case <-time.After(30 * time.Second):
			t.Error("serve did not return 30 s after its context ended")
		}
	})
	listening := regexp.MustCompile(`"msg":"listening","addr":"([^"]+)"`)
	for deadline := time.Now().Add(30 * time.Second); base == ""; time.Sleep(10 * time.Millisecond) {
		if m := listening.FindStringSubmatch(logs.String()); m != nil {
			base = "http://" + m[1]
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve never listened:\n%s", logs)
		}
	}
	return base, logs, cancel, served
}

type serveResult struct {
	done chan struct{}
	err  error // once done is closed
}

// TestShutdownFailsReadinessFirst: after SIGTERM, /readyz answers 503
// while the listener still serves requests, for SHOP_DRAIN_DELAY, so that
// a load balancer stops sending new ones before any is refused.
func TestShutdownFailsReadinessFirst(t *testing.T) {
	base, logs, stop, served := serveInProcess(t, map[string]string{
		"SHOP_ENV": "production", "SHOP_JWT_SECRET": testSecret, "SHOP_ADMIN_TOKEN": testAdmin,
		"SHOP_HTTP_ADDR": "127.0.0.1:0", "SHOP_DRAIN_DELAY": "2s",
	})
	client := shoptest.NewClient(2)
	defer client.Close()
	client.Must(t, http.StatusOK, "GET", base+"/readyz", "", nil)
	stop()
	var r shoptest.Response
	for deadline := time.Now().Add(10 * time.Second); r.Status != http.StatusServiceUnavailable; time.Sleep(10 * time.Millisecond) {
		var err error
		if r, err = client.Do(context.Background(), "GET", base+"/readyz", "", nil); err != nil {
			t.Fatalf("/readyz refused before it ever said 503: %v\n%s", err, logs)
		}
		if time.Now().After(deadline) {
			t.Fatalf("/readyz still %d after SIGTERM", r.Status)
		}
	}
	if !strings.Contains(string(r.Body), "shutdown") {
		t.Errorf("/readyz during the drain: %s; want it to name the shutdown", r.Body)
	}
	// Readiness failed, and the instance still answers.
	client.Must(t, http.StatusOK, "GET", base+"/healthz", "", nil)
	<-served.done
	if served.err != nil {
		t.Errorf("serve: %v", served.err)
	}
	if _, err := client.Do(context.Background(), "GET", base+"/healthz", "", nil); err == nil {
		t.Error("the listener still accepts after serve returned")
	}
}

// TestShutdownNeverClosesStoresUnderAHandler runs serve in this process
// with a shutdown timeout (500 ms) shorter than a withdrawal's critical
// section (3 s) and stops it while the withdrawal holds its lock. The
// stores may close only once that handler has returned: serve must not
// return before the request's log line, the handler must never meet a
// closed database, and the client gets a whole answer, not a cut
// connection.
func TestShutdownNeverClosesStoresUnderAHandler(t *testing.T) {
	vars := map[string]string{
		"SHOP_ENV": "production", "SHOP_JWT_SECRET": testSecret, "SHOP_ADMIN_TOKEN": testAdmin,
		"SHOP_HTTP_ADDR": "127.0.0.1:0", "SHOP_SQLITE_PATH": t.TempDir() + "/shop.db",
		"SHOP_CRITICAL_SECTION_DELAY": "3s", "SHOP_SHUTDOWN_TIMEOUT": "500ms", "SHOP_DRAIN_DELAY": "0",
		"SHOP_ALLOW_RESET": "true",
	}
	base, logs, stop, served := serveInProcess(t, vars)
	client := shoptest.NewClient(4)
	defer client.Close()
	client.Must(t, http.StatusOK, "POST", base+"/admin/v1/reset", testAdmin, nil)
	tok := shoptest.Token(t, testSecret, 1)

	done := make(chan shoptest.Response, 1)
	go func() {
		r, err := client.Do(context.Background(), "POST", base+"/api/v1/accounts/1/withdraw", tok, `{"amount_cents":100}`)
		if err != nil {
			r.Body = []byte("transport error: " + err.Error())
		}
		done <- r
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		m := client.Must(t, http.StatusOK, "GET", base+"/metrics", "", nil)
		if strings.Contains(string(m.Body), `shop_lock_wait_seconds_count{backend="redis",class="account"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the withdrawal never took its lock")
		}
	}
	stop()

	select {
	case <-served.done:
		if served.err == nil || !strings.Contains(served.err.Error(), "cancelled") {
			t.Errorf("serve: %v; want the overrun reported", served.err)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("serve did not return 20 s after its context ended:\n%s", logs)
	}
	atReturn := logs.String()
	res := <-done
	// Give a handler that outlived serve the time to hit the closed stores.
	time.Sleep(3 * time.Second)
	all := logs.String()

	if !strings.Contains(atReturn, `"path":"/api/v1/accounts/1/withdraw"`) {
		t.Errorf("serve returned, and so closed the stores, before the withdrawal's handler returned")
	}
	if strings.Contains(all, "database is closed") {
		t.Errorf("a handler ran on a closed database")
	}
	if res.Status != http.StatusServiceUnavailable {
		t.Errorf("in-flight withdrawal cut by the shutdown answered %d %s; want 503", res.Status, res.Body)
	}
	if t.Failed() {
		t.Logf("logs:\n%s", all)
	}
}

// TestShutdownAnswersAClientStillSendingItsBody stops serve while a client
// has sent half a body: the read it blocks is ended by the shutdown
// timeout like any other work, the client is answered 503 shutting-down,
// and the stores close.
func TestShutdownAnswersAClientStillSendingItsBody(t *testing.T) {
	base, logs, stop, served := serveInProcess(t, map[string]string{
		"SHOP_ENV": "production", "SHOP_JWT_SECRET": testSecret, "SHOP_ADMIN_TOKEN": testAdmin,
		"SHOP_HTTP_ADDR": "127.0.0.1:0", "SHOP_SQLITE_PATH": t.TempDir() + "/shop.db",
		"SHOP_SHUTDOWN_TIMEOUT": "500ms", "SHOP_DRAIN_DELAY": "0",
	})
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	body := `{"amount_cents":1}`
	fmt.Fprintf(conn, "POST /api/v1/accounts/1/deposit HTTP/1.1\r\nHost: shop\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\nExpect: 100-continue\r\n\r\n",
		shoptest.Token(t, testSecret, 1), len(body))
	replies := bufio.NewReader(conn)
	// The server asks for the body once the handler reads it.
	if line, err := replies.ReadString('\n'); err != nil || !strings.Contains(line, "100 Continue") {
		t.Fatalf("before the body: %q %v; want 100 Continue", line, err)
	}
	if _, err := replies.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	fmt.Fprint(conn, body[:8])
	stop()

	_ = conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	res, err := http.ReadResponse(replies, nil)
	if err != nil {
		t.Fatalf("the half-sent request got no answer: %v\n%s", err, logs)
	}
	answer, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusServiceUnavailable || !strings.Contains(string(answer), "shutting-down") {
		t.Errorf("the half-sent request answered %d %s; want 503 shutting-down", res.StatusCode, answer)
	}
	<-served.done
	if served.err == nil || strings.Contains(served.err.Error(), "stores open") {
		t.Errorf("serve: %v; want the overrun reported and the stores closed\n%s", served.err, logs)
	}
}
