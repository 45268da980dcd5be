package faults

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
)

const sentinelMaster = "faults"

// sentinelSet starts a private master, its replica and three Sentinels
// (quorum 2, down-after 1 s), so the shared Sentinel group of testenv.sh is
// never failed over.
func sentinelSet(t *testing.T) (master, replica *server, sentinels []string) {
	t.Helper()
	redisServer := func(extra ...string) *server {
		port := freePort(t)
		s := &server{t: t, kind: "redis", dir: t.TempDir(), addr: fmt.Sprintf("127.0.0.1:%d", port)}
		s.args = append([]string{"redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "",
			"--appendonly", "no", "--dir", s.dir, "--protected-mode", "no", "--repl-diskless-sync-delay", "0"}, extra...)
		s.ready = redisReady(s.addr)
		s.start()
		t.Cleanup(func() { s.stop(syscall.SIGKILL) })
		return s
	}
	master = redisServer()
	host, port, _ := strings.Cut(master.addr, ":")
	replica = redisServer("--replicaof", host, port)
	for range 3 {
		s := &server{t: t, kind: "sentinel", dir: t.TempDir()}
		p := freePort(t)
		s.addr = fmt.Sprintf("127.0.0.1:%d", p)
		conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 2\n"+
			"sentinel down-after-milliseconds %[3]s 1000\nsentinel failover-timeout %[3]s 3000\n",
			p, s.dir, sentinelMaster, host, port)
		if err := os.WriteFile(filepath.Join(s.dir, "sentinel.conf"), []byte(conf), 0o644); err != nil {
			t.Fatal(err)
		}
		s.args = []string{"redis-sentinel", filepath.Join(s.dir, "sentinel.conf")}
		s.ready = redisReady(s.addr)
		s.start()
		t.Cleanup(func() { s.stop(syscall.SIGKILL) })
		sentinels = append(sentinels, s.addr)
	}
	// Ready when every Sentinel knows the replica and the others.
	deadline := time.Now().Add(60 * time.Second)
	for _, addr := range sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
		for {
			replicas, err1 := sc.Replicas(context.Background(), sentinelMaster).Result()
			sentinels, err2 := sc.Sentinels(context.Background(), sentinelMaster).Result()
			if err1 == nil && err2 == nil && len(replicas) >= 1 && len(sentinels) >= 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("sentinel %s: replicas %v (%v), sentinels %v (%v)", addr, replicas, err1, sentinels, err2)
			}
			time.Sleep(200 * time.Millisecond)
		}
		sc.Close()
	}
	return master, replica, sentinels
}

// TestRedisFailover is fault 4: a lock granted on a master that dies before
// the grant reaches its replica is granted again by the promoted replica,
// the literature's warning (two live grants of one key). The promoted
// replica's fence counter missed that grant, but a token is never below the
// server's clock in microseconds, so the second grant's token is still the
// higher one: the fenced store refuses the stale holder, accepts the new
// one at once, and keeps the balance whole (docs/faults.md).
func TestRedisFailover(t *testing.T) {
	needFull(t)
	t.Parallel()
	master, replica, sentinels := sentinelSet(t)
	f := newFailoverAccount(t, sentinels)
	fo := failOver(t, f, master, func(killed time.Time) { awaitPromotion(t, replica, killed) })
	res := fo.row("4 failover (Sentinel)")
	report(res)
	t.Logf("%+v (failover took %v)", res, fo.promoted.Round(time.Millisecond))
	fo.check(t)
}

// failOver is the row on f's lock: a grant replicated, replication cut,
// g1 granted and written, master killed; once promoted has returned (the
// lock's client reaches the promoted replica), g2 is granted and both
// holders write.
func failOver(t *testing.T, f *failoverAccount, master *server, promoted func(killed time.Time)) failover {
	t.Helper()
	ctx := context.Background()
	// A first grant, replicated: the replica knows the key's counter.
	g0 := f.grant(t)
	if err := f.deposit(g0.Fence(), 1); err != nil {
		t.Fatalf("g0 deposit: %v", err)
	}
	if err := g0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	mc := redis.NewClient(&redis.Options{Addr: master.addr})
	defer mc.Close()
	if n, err := mc.Do(ctx, "WAIT", 1, 5000).Int(); err != nil || n != 1 {
		t.Fatalf("WAIT for the replica: %d, %v", n, err)
	}

	cutReplication(t, mc)
	var fo failover
	fo.g1 = f.grant(t)
	info, _ := mc.Info(ctx, "replication").Result()
	if !strings.Contains(info, "connected_slaves:0") {
		t.Fatalf("the replica is still attached:\n%s", info)
	}
	fo.g1Write = f.deposit(fo.g1.Fence(), 10)

	killed := time.Now()
	master.stop(syscall.SIGKILL)
	promoted(killed)
	fo.promoted = time.Since(killed)

	fo.g2 = f.grant(t)
	fo.recovery = time.Since(killed)
	fo.overlap = !backend.IsClosed(fo.g1.Lost())
	fo.g2Write = f.deposit(fo.g2.Fence(), 100)
	fo.g1Again = f.deposit(fo.g1.Fence(), 1000) // the stale holder writes once more
	_ = fo.g2.Release(ctx)

	fo.extra, fo.g3Write = f.grantsUntilAccepted(t)

	var err error
	if fo.drift, err = f.store.Drift(ctx); err != nil {
		t.Fatal(err)
	}
	return fo
}

// failoverAccount is account 1 in the shop's MariaDB, under the lock of a
// Redis with a replica (found through Sentinel, or a Cluster's shard).
type failoverAccount struct {
	locker lockkit.Locker
	prefix string // the Locker's key prefix
	store  *account.Store
	id     int64
}

func newFailoverAccount(t *testing.T, sentinels []string) *failoverAccount {
	t.Helper()
	client := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: sentinelMaster, SentinelAddrs: sentinels,
		DialTimeout: time.Second, ReadTimeout: time.Second, WriteTimeout: time.Second, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	return newLockedAccount(t, client)
}

// newLockedAccount is account 1 in a private database, under the Redis
// lock on client.
func newLockedAccount(t *testing.T, client redis.UniversalClient) *failoverAccount {
	t.Helper()
	ctx := context.Background()
	prefix := shoptest.Prefix("faults")
	locker, err := redislock.New(client, redislock.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Close() })

	db, err := storage.Open(ctx, storage.Options{MySQLDSN: shoptest.MySQL(t), MaxConns: 4})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Migrate(ctx, account.Models()...); err != nil {
		t.Fatal(err)
	}
	f := &failoverAccount{locker: locker, prefix: prefix, store: account.NewStore(db.DB), id: 1}
	if _, err := f.store.Put(ctx, f.id, opening); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *failoverAccount) deposit(fence uint64, amount int64) error {
	return f.store.Update(context.Background(), "deposit", []int64{f.id}, map[int64]uint64{f.id: fence},
		func(_ context.Context, a []*account.Account) error { a[0].Balance += amount; return nil })
}

func (f *failoverAccount) grant(t *testing.T) lockkit.Lease {
	t.Helper()
	key := account.Key(f.id).String()
	l, err := f.locker.Acquire(context.Background(), key, lockkit.WithTTL(20*time.Second), lockkit.WithWaitTimeout(30*time.Second))
	if err != nil {
		t.Fatalf("acquire %s: %v", key, err)
	}
	return l
}

// grantsUntilAccepted counts the grants until a write is accepted again
// (at most 100), and returns the last write's error.
func (f *failoverAccount) grantsUntilAccepted(t *testing.T) (int, error) {
	t.Helper()
	extra := 0
	var write error
	for extra = 1; extra <= 100; extra++ {
		g := f.grant(t)
		write = f.deposit(g.Fence(), 1)
		_ = g.Release(context.Background())
		if write == nil {
			break
		}
	}
	return extra, write
}

// cutReplication cuts the master's replication before the next grant: the
// replica may no longer (re)synchronise, and its current link is dropped.
func cutReplication(t *testing.T, mc *redis.Client) {
	t.Helper()
	ctx := context.Background()
	if err := mc.Do(ctx, "ACL", "SETUSER", "default", "-psync", "-sync").Err(); err != nil {
		t.Fatal(err)
	}
	if err := mc.Do(ctx, "CLIENT", "KILL", "TYPE", "replica").Err(); err != nil {
		t.Fatal(err)
	}
}

// awaitPromotion waits up to 60 s from killed for Sentinel to promote
// replica.
func awaitPromotion(t *testing.T, replica *server, killed time.Time) {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: replica.addr})
	defer rc.Close()
	for {
		role, _ := rc.Do(context.Background(), "ROLE").Slice()
		if len(role) > 0 && role[0] == "master" {
			return
		}
		if time.Since(killed) > 60*time.Second {
			t.Fatalf("no failover within 60s; replica's role %v", role)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// failover is what the grants around a failover got: g1 on the lost
// master, g2 on the promoted replica, and the writes each made.
type failover struct {
	g1, g2                             lockkit.Lease
	overlap                            bool // g1 still held when g2 was granted
	g1Write, g2Write, g1Again, g3Write error
	extra                              int // grants after g2 until a write was accepted
	drift                              map[string]int64
	// promoted and recovery are how long after the kill the replica was
	// promoted and g2 was granted.
	promoted, recovery time.Duration
}

func (fo failover) row(fault string) row {
	fenced := 0
	for _, e := range []error{fo.g1Write, fo.g2Write, fo.g1Again} {
		if errors.Is(e, lockkit.ErrFenced) {
			fenced++
		}
	}
	res := row{Fault: fault, Backend: "redis", Fenced: fenced, LostCents: fo.drift["1"],
		Recovery: fo.recovery,
		Stale: fmt.Sprintf("tokens g1=%d g2=%d; g1 write %s, g2 write %s, g1 again %s; writes accepted again after %d more grants",
			fo.g1.Fence(), fo.g2.Fence(), errText(fo.g1Write), errText(fo.g2Write), errText(fo.g1Again), fo.extra)}
	if fo.overlap {
		res.Overlap = 1
	}
	return res
}

// check: the failover made two live grants, the promoted replica's token
// is the higher, the fenced store refused only the stale holder, and the
// balance stayed whole.
func (fo failover) check(t *testing.T) {
	t.Helper()
	if !fo.overlap {
		t.Errorf("g1's lease was already lost when g2 was granted; the failover did not produce two live grants")
	}
	if fo.g1Write != nil {
		t.Errorf("g1's write while it alone held the lock: %v", fo.g1Write)
	}
	if fo.g2.Fence() <= fo.g1.Fence() {
		t.Errorf("the promoted replica granted token %d after the lost master's %d", fo.g2.Fence(), fo.g1.Fence())
	}
	if fo.g2Write != nil {
		t.Errorf("the new holder's write was refused (liveness lost): %v", fo.g2Write)
	}
	if !errors.Is(fo.g1Again, lockkit.ErrFenced) {
		t.Errorf("the stale holder's write after the new holder's: %v, want ErrFenced", fo.g1Again)
	}
	if len(fo.drift) != 0 {
		t.Errorf("the fenced store lost updates in the failover: drift %v", fo.drift)
	}
	if fo.g3Write != nil || fo.extra != 1 {
		t.Errorf("writes refused for %d grants after the new holder's: %v", fo.extra-1, fo.g3Write)
	}
}

func errText(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, lockkit.ErrFenced):
		return "fenced"
	}
	return err.Error()
}

// staleWriter holds a grant of a second account across a lock server's
// restart without persistence, to show what the restarted server's tokens
// do to the fenced store: a new holder's write must be accepted, and the
// stale holder's write after it refused.
type staleWriter struct {
	id    int64
	lease lockkit.Lease
	store *account.Store
}

// newStaleWriter creates account id on the service at url and takes its
// lock straight from the Redis at addr, as the service would, and writes
// once with it.
func newStaleWriter(t *testing.T, r *rig, url, addr string, id int64) *staleWriter {
	t.Helper()
	ctx := context.Background()
	r.account(url, id, opening)
	client := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	locker, err := redislock.New(client, redislock.WithPrefix(r.env["SHOP_KEY_PREFIX"]))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locker.Close() })
	db, err := storage.Open(ctx, storage.Options{MySQLDSN: r.env["SHOP_MYSQL_DSN"], MaxConns: 2})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	w := &staleWriter{id: id, store: account.NewStore(db.DB)}
	w.lease, err = locker.Acquire(ctx, account.Key(id).String(), lockkit.WithTTL(time.Minute), lockkit.WithWaitTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if err := w.deposit(1); err != nil {
		t.Fatalf("the holder's write before the restart: %v", err)
	}
	return w
}

func (w *staleWriter) deposit(amount int64) error {
	return w.store.Update(context.Background(), "deposit", []int64{w.id}, map[int64]uint64{w.id: w.lease.Fence()},
		func(_ context.Context, a []*account.Account) error { a[0].Balance += amount; return nil })
}

// verify runs after the restart: a deposit through the service (a new
// holder), then one with the stale grant. It reports both for the row.
func (w *staleWriter) verify(t *testing.T, r *rig, url string) string {
	t.Helper()
	newHolder := r.hist.do(context.Background(), r.client, url, r.token(w.id), w.id, accInput{Kind: "deposit", Amount: 7})
	stale := w.deposit(1000)
	if newHolder.Err != nil || newHolder.Status != http.StatusOK {
		t.Errorf("a new holder's deposit after the restart: %s (liveness lost)", newHolder.String())
	}
	if !errors.Is(stale, lockkit.ErrFenced) {
		t.Errorf("the stale holder's write (token %d) after the new holder's: %v, want ErrFenced", w.lease.Fence(), stale)
	}
	return fmt.Sprintf("; stale holder (token %d): %s, new holder: %d", w.lease.Fence(), errText(stale), newHolder.Status)
}
