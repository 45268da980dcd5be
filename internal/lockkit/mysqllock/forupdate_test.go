package mysqllock_test

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/lockbench/shop/internal/lockkit"
)

// A holder whose transaction is rolled back (here: killed) must not share
// its fence with the next holder. A fence bumped inside the transaction
// would be rolled back with it and handed out again.
func TestForUpdateFenceOutlivesKilledHolder(t *testing.T) {
	dsn := testDSN(t)
	a, b := newRowLocker(t, dsn), newRowLocker(t, dsn)
	defer a.Close()
	defer b.Close()
	ctx, key := context.Background(), "mysqllock:"+t.Name()

	la := mustTry(t, a, key, lockkit.WithTTL(time.Minute))
	killHolder(t, dsn, key)
	lb := mustAcquire(t, b, key, lockkit.WithTTL(time.Minute))
	defer lb.Release(ctx)
	if lb.Fence() <= la.Fence() {
		t.Fatalf("grant after a killed holder has fence %d, the killed holder had %d", lb.Fence(), la.Fence())
	}
	if err := la.Release(ctx); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("release by the killed holder = %v, want ErrNotHeld", err)
	}
}

// A lease that runs out unrenewed frees its row at once: its connection is
// dropped when Lost closes, without waiting for the server's wait_timeout.
func TestForUpdateExpiredLeaseFreesRow(t *testing.T) {
	dsn := testDSN(t)
	a, b := newRowLocker(t, dsn), newRowLocker(t, dsn)
	defer a.Close()
	defer b.Close()
	ctx, key := context.Background(), "mysqllock:"+t.Name()

	la := mustTry(t, a, key, lockkit.WithTTL(ttl)) // never extended, never released
	<-la.Lost()
	waitUntil(t, "the expired lease's row to be free", func() bool {
		lb, err := b.TryAcquire(ctx, key, lockkit.WithTTL(time.Minute))
		if err == nil {
			defer lb.Release(ctx)
		}
		return err == nil
	})
	if err := la.Release(ctx); !errors.Is(err, lockkit.ErrNotHeld) {
		t.Fatalf("release of the expired lease = %v, want ErrNotHeld", err)
	}
}

// A paused holder (SIGSTOP: the process is frozen, its TCP connection stays
// open, nothing of its own can run) keeps its row lock only until the
// server's wait_timeout, the TTL rounded up to whole seconds, ends its
// session.
func TestForUpdatePausedHolderEndedByServer(t *testing.T) {
	dsn := testDSN(t)
	ctx, key := context.Background(), "mysqllock:"+t.Name()
	if os.Getenv(holdEnv) != "" {
		holdForever(t, newRowLocker(t, dsn), key)
	}
	holder := exec.Command(os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	holder.Env = append(os.Environ(), holdEnv+"=1")
	holder.Stderr = os.Stderr
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = holder.Process.Kill()
		_ = holder.Wait()
	}()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "held\n" {
		t.Fatalf("holder process did not report holding the key: %q %v", line, err)
	}
	if err := holder.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	b := newRowLocker(t, dsn)
	defer b.Close()
	lb := mustAcquire(t, b, key, lockkit.WithTTL(time.Minute), lockkit.WithWaitTimeout(10*time.Second))
	_ = lb.Release(ctx)
}

// holdEnv makes a test binary run as the holder process of a test.
const holdEnv = "MYSQLLOCK_TEST_HOLDER"

// holdForever is the holder process: it takes key with a short explicit
// TTL, says so, and waits to be stopped and killed.
func holdForever(t *testing.T, l lockkit.Locker, key string) {
	if _, err := l.TryAcquire(context.Background(), key, lockkit.WithTTL(ttl)); err != nil {
		t.Fatalf("holder: %v", err)
	}
	fmt.Println("held")
	select {}
}

// A cancelled waiter must not stay queued on the row lock in the server,
// where it would be granted the lock after the holder, and hold it, for
// nothing. A client that only hangs up does stay queued.
func TestForUpdateCancelledWaiterLeavesNoSession(t *testing.T) {
	dsn := testDSN(t)
	a, b := newRowLocker(t, dsn), newRowLocker(t, dsn)
	defer a.Close()
	defer b.Close()
	ctx, key := context.Background(), "mysqllock:"+t.Name()

	la := mustTry(t, a, key, lockkit.WithTTL(time.Minute))
	defer la.Release(ctx)
	waitCtx, cancel := context.WithCancel(ctx)
	waited := make(chan error, 1)
	go func() {
		_, err := b.Acquire(waitCtx, key)
		waited <- err
	}()
	waitUntil(t, "the waiter to queue in the server", func() bool { return sessionsOn(t, dsn, key) == 1 })
	cancel()
	if err := <-waited; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled Acquire = %v, want context.Canceled", err)
	}
	waitUntil(t, "the waiter's session to end", func() bool { return sessionsOn(t, dsn, key) == 0 })
}

// The wait before a grant is not taken out of the lease: a waiter granted
// after longer than its TTL still holds a lease it can trust.
func TestForUpdateWaiterGetsWholeTTL(t *testing.T) {
	dsn := testDSN(t)
	a, b := newRowLocker(t, dsn), newRowLocker(t, dsn)
	defer a.Close()
	defer b.Close()
	ctx, key := context.Background(), "mysqllock:"+t.Name()

	la := mustTry(t, a, key, lockkit.WithTTL(time.Minute))
	go func() {
		time.Sleep(2 * ttl)
		_ = la.Release(ctx)
	}()
	lb := mustAcquire(t, b, key, lockkit.WithTTL(ttl))
	defer lb.Release(ctx)
	// Half a TTL in, the lease must stand; counted from the request, it
	// would have been lost on arrival.
	select {
	case <-lb.Lost():
		t.Fatal("a lease granted after a wait of 2 TTLs was lost within half its TTL: its TTL was counted from the request")
	case <-time.After(ttl / 2):
	}
}

// sessionsOn counts the server sessions running a statement on key, other
// than the lock's holder, which is idle inside its transaction.
// MariaDB keeps wait_timeout at most 365 days (a larger value is cut to
// that with a warning): a grant or an Extend asking for more is capped
// there, and the lease trusts no more than the server enforces.
func TestForUpdateTTLBeyondTheServersMaximumIsCapped(t *testing.T) {
	l := newRowLocker(t, testDSN(t))
	defer l.Close()
	ctx, key := context.Background(), "mysqllock:"+t.Name()
	const asked, kept = 400 * 24 * time.Hour, 365 * 24 * time.Hour
	lease := mustTry(t, l, key, lockkit.WithTTL(asked))
	defer lease.Release(ctx)
	granted := time.Now()
	if got := deadline(t, lease); got.After(granted.Add(kept)) {
		t.Errorf("grant of %v trusted for %v; the server keeps a session idle %v at most", asked, got.Sub(granted), kept)
	}
	if err := lease.Extend(ctx, asked); err != nil {
		t.Fatalf("Extend(%v): %v", asked, err)
	}
	answered := time.Now()
	if got := deadline(t, lease); got.After(answered.Add(kept)) {
		t.Errorf("Extend(%v) trusted for %v; the server keeps a session idle %v at most", asked, got.Sub(answered), kept)
	}
}

// deadline is when lease's Lost closes unless a renewal moves it.
func deadline(t *testing.T, lease lockkit.Lease) time.Time {
	t.Helper()
	d, ok := lease.(interface{ Deadline() time.Time })
	if !ok {
		t.Fatalf("%T reports no deadline", lease)
	}
	return d.Deadline()
}

func sessionsOn(t testing.TB, dsn, key string) int {
	t.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	err = db.QueryRow("SELECT COUNT(*) FROM information_schema.PROCESSLIST "+
		"WHERE ID <> CONNECTION_ID() AND COMMAND = 'Query' AND INFO LIKE CONCAT('%', ?, '%')", key).Scan(&n)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// waitUntil polls cond for a few seconds: the server ends a KILLed session
// asynchronously.
func waitUntil(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func mustTry(t testing.TB, l lockkit.Locker, key string, opts ...lockkit.Option) lockkit.Lease {
	t.Helper()
	lease, err := l.TryAcquire(context.Background(), key, opts...)
	if err != nil {
		t.Fatalf("TryAcquire %s: %v", key, err)
	}
	return lease
}

func mustAcquire(t testing.TB, l lockkit.Locker, key string, opts ...lockkit.Option) lockkit.Lease {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, key, opts...)
	if err != nil {
		t.Fatalf("Acquire %s: %v", key, err)
	}
	return lease
}

// Each lease holds a connection of the Locker's own, and the service nests
// locks (an order takes its idempotency key, then an account, then a SKU;
// the like audit takes every entity of an owner). Holding more leases at
// once than the pool keeps must never make a grant wait for a connection
// that only a lease of the same caller could give back.
func TestForUpdateNestedLeasesBeyondPoolSize(t *testing.T) {
	dsn := testDSN(t)
	l := newRowLocker(t, dsn)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const nested = 40 // above the default pool of 16 and the bench's 40
	var leases []lockkit.Lease
	defer func() {
		for _, lease := range leases {
			_ = lease.Release(context.Background())
		}
	}()
	for i := range nested {
		lease, err := l.Acquire(ctx, fmt.Sprintf("mysqllock:%s:%d", t.Name(), i), lockkit.WithTTL(time.Minute))
		if err != nil {
			t.Fatalf("lease %d of %d nested: %v", i+1, nested, err)
		}
		leases = append(leases, lease)
	}
}

// A waiter cancelled before its statement's first reply (the session's id,
// which a KILL needs) has reached it returns promptly too. It hung for
// ever before: the hang-up on cancel was armed only once the id was read,
// and the statement runs detached from ctx. CI caught it as a flake of
// TestForUpdateCancelOnBlackHoledServerReturnsPromptly, whose black hole
// sometimes swallowed that reply.
func TestForUpdateCancelBeforeTheSessionIsKnownReturnsPromptly(t *testing.T) {
	cancelWaiterBehindCut(t, (*replyCutter).mute, nil, "its session's id never read")
}

// A waiter cancelled after its server stopped answering returns promptly:
// the KILL that should end its queued session cannot get through either,
// and waiting for it to time out must not hold the caller.
func TestForUpdateCancelOnBlackHoledServerReturnsPromptly(t *testing.T) {
	cancelWaiterBehindCut(t, nil, (*replyCutter).blackhole, "behind a black-holed server")
}

// cancelWaiterBehindCut queues a waiter, through a reply cutter, behind a
// row held by another Locker, applies beforeQueue to the cutter before the
// waiter's statement is sent and afterQueue once it waits on the row (each
// may be nil), cancels the waiter, and wants Canceled within a second.
func cancelWaiterBehindCut(t *testing.T, beforeQueue, afterQueue func(*replyCutter), what string) {
	t.Helper()
	dsn := testDSN(t)
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	p := newReplyCutter(t, cfg.Addr)
	cfg.Addr = p.addr
	holder, waiter := newRowLocker(t, dsn), newRowLocker(t, cfg.FormatDSN())
	defer holder.Close()
	defer waiter.Close()
	ctx, key := context.Background(), "mysqllock:"+t.Name()
	// The waiter's pool keeps the connection it opens here.
	if err := mustTry(t, waiter, key+":warm-up").Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease := mustTry(t, holder, key, lockkit.WithTTL(time.Minute))
	defer lease.Release(ctx)

	if beforeQueue != nil {
		beforeQueue(p)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Acquire(wctx, key)
		done <- err
	}()
	waitUntil(t, "the waiter to queue on the row", func() bool { return sessionsOn(t, dsn, key) == 1 })
	if afterQueue != nil {
		afterQueue(p)
	}
	cancel()
	start := time.Now()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire = %v, want Canceled", err)
		}
		if waited := time.Since(start); waited > time.Second {
			t.Fatalf("cancelled Acquire returned after %v, %s", waited, what)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("cancelled Acquire did not return, %s", what)
	}
}
