package main

import (
	"context"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

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
