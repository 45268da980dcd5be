package faults

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
	"github.com/lockbench/shop/internal/lockkit/etcdlock"
	"github.com/lockbench/shop/internal/lockkit/zklock"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
)

// The session settings of the cluster rows: the shortest each server
// allows with its defaults (etcd's minimum lease TTL is about 1.5 times its
// 1 s election timeout), so that the rows show the least a user can set.
const (
	clusterEtcdTTL   = 2 * time.Second
	clusterZKSession = 4 * time.Second

	// clusterHold is how long the holder keeps the key after the fault
	// when its lease survives: longer than any session above plus an
	// election, so that a lease the fault ends is seen lost first.
	clusterHold = 10 * time.Second
	// clusterAttempt is the wait of each Acquire a waiter makes; a waiter
	// whose attempt fails (the server unavailable) tries again, as a
	// client would.
	clusterAttempt = 60 * time.Second
	// quorumDown is how long the quorum-loss row keeps two members down:
	// longer than the sessions, so that every session would expire.
	quorumDown = 8 * time.Second
	// quorumNoticed is how long the member left may take to know it has
	// no quorum: etcd's election timeout (1 s), ZooKeeper's syncLimit
	// (2.5 s), and slack for a loaded machine. An Acquire begun later must
	// say the lock server is unavailable.
	quorumNoticed = 4 * time.Second
)

// clusterFault is one way a cluster fails. inject breaks the cluster
// under a holder and its waiters (the holder's lease granted, the waiters
// queued), and marks the instant "usable again" is measured from (the
// fault, or the quorum's return); heal, run after the row, brings every
// member back.
type clusterFault struct {
	name string
	// clients opens the holder's client and names the members the
	// waiters' clients are given (nil: every member); nil opens every
	// client on every member.
	clients func(t *testing.T, c *cluster, r *clusterRow) (holder lockkit.Locker, waiters []int)
	inject  func(t *testing.T, c *cluster, r *clusterRow)
	heal    func(t *testing.T, c *cluster)
	// suspends: the fault closes the holder's ZooKeeper connection at
	// once (a member it talks to dies, or gives up on a lost quorum), and
	// the holder must count its lease lost then (SUSPENDED is lost, as
	// Curator's Tech Note 10 says), not when its session expires.
	suspends bool
	// session, if set, is the session TTL (etcd) or timeout (ZooKeeper)
	// of the row's clients in place of the shortest.
	session time.Duration
}

var clusterFaults = []clusterFault{
	{
		name: "8 cluster: leader killed (SIGKILL)",
		inject: func(t *testing.T, c *cluster, r *clusterRow) {
			r.setTarget(c.leader(t))
			r.mark()
			c.members[r.targetNow()].stop(syscall.SIGKILL)
		},
		heal:     restartStopped,
		suspends: true,
	},
	{
		// The same with the sessions etcdlock and zklock default to: an
		// election no longer outlasts an etcd session.
		name: "8 cluster: leader killed, 10s sessions",
		inject: func(t *testing.T, c *cluster, r *clusterRow) {
			r.setTarget(c.leader(t))
			r.mark()
			c.members[r.targetNow()].stop(syscall.SIGKILL)
		},
		heal:     restartStopped,
		suspends: true,
		session:  10 * time.Second,
	},
	{
		// The holder talks to the leader alone, so it is on the wrong side
		// of the cut; the waiters talk to the other two.
		name: "8 cluster: leader partitioned",
		clients: func(t *testing.T, c *cluster, r *clusterRow) (lockkit.Locker, []int) {
			r.target = c.leader(t)
			return c.locker(t, []int{r.target}), others(r.target)
		},
		inject: func(t *testing.T, c *cluster, r *clusterRow) {
			c.partition(r.target)
			r.mark()
		},
		heal: func(t *testing.T, c *cluster) { c.heal() },
	},
	{
		name:    "8 cluster: holder's member killed",
		clients: onFollower,
		inject: func(t *testing.T, c *cluster, r *clusterRow) {
			r.mark()
			c.members[r.targetNow()].stop(syscall.SIGKILL)
		},
		heal:     restartStopped,
		suspends: true,
	},
	{
		name:     "8 cluster: quorum lost, restored",
		inject:   quorumLoss,
		heal:     restartStopped,
		suspends: true,
	},
}

// TestClusterFaults is fault 8: a 3-member etcd cluster and a 3-member
// ZooKeeper ensemble (each member in its own network namespace) lose their
// leader, have it cut off, lose the member a holder is connected to, and
// lose their quorum, while a client holds an account's lock and two others
// wait for it. Each grant writes through the fenced account store; the
// holder that lost its lease writes once more, late, after a new holder
// has written (as a holder paused between its check and its write would).
// Asserted in every row: no two live grants, the late write refused by the
// fence, nothing lost, the history linearizable, every waiter served.
func TestClusterFaults(t *testing.T) {
	needFull(t)
	for _, kind := range []string{"etcd", "zookeeper"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, kind)
			store := accountStore(t)
			for i, f := range clusterFaults {
				ok := t.Run(f.name, func(t *testing.T) {
					c.use(t)
					r := &clusterRow{t: t, c: c, store: store, hist: newHistory(), id: int64(i + 1)}
					r.run(f)
				})
				c.use(t)
				f.heal(t, c)
				c.healthy()
				if !ok {
					return
				}
			}
		})
	}
}

func accountStore(t *testing.T) *account.Store {
	t.Helper()
	ctx := context.Background()
	db, err := storage.Open(ctx, storage.Options{MySQLDSN: shoptest.MySQL(t), MaxConns: 8})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := db.Migrate(ctx, account.Models()...); err != nil {
		t.Fatal(err)
	}
	return account.NewStore(db.DB)
}

// restartStopped starts again every member a fault stopped.
func restartStopped(t *testing.T, c *cluster) {
	for _, m := range c.members {
		if m.cmd == nil {
			m.launch()
		}
	}
}

// partition cuts member i off from the others, until heal.
func (c *cluster) partition(i int) {
	c.net.partition(i)
	c.isolated = &i
}

func (c *cluster) heal() {
	if c.isolated != nil {
		c.net.heal(*c.isolated)
		c.isolated = nil
	}
}

// locker opens a Locker of the cluster's backend on the given members,
// closed when t ends.
func (c *cluster) locker(t *testing.T, members []int) lockkit.Locker {
	t.Helper()
	l, err := c.open(members)
	if err != nil {
		t.Fatalf("open a %s locker on %v: %v", c.kind, c.addrs(members...), err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// open opens a Locker with the row's session (c.session, or the shortest).
func (c *cluster) open(members []int) (lockkit.Locker, error) {
	if c.kind == "etcd" {
		return etcdlock.New(c.addrs(members...), etcdlock.WithPrefix("/shop/faults/"),
			etcdlock.WithSessionTTL(cmp.Or(c.session, clusterEtcdTTL)))
	}
	return zklock.New(c.addrs(members...), cmp.Or(c.session, clusterZKSession), zklock.WithRoot("/shop/faults"))
}

// clusterRow is one fault on one cluster: the account it writes to, its
// history, and what its clients saw.
type clusterRow struct {
	t     *testing.T
	c     *cluster
	store *account.Store
	hist  *history
	id    int64
	// target is the member the fault hits.
	target int

	mu       sync.Mutex
	lease    lockkit.Lease // the holder's
	released bool          // the holder has begun its release
	overlap  int
	grants   []time.Time
	attempts []attempt
	probes   string // what quorumLoss saw, for the row
	// from is the instant usable again is measured from; a probe's
	// grant counts only after it.
	from   time.Time
	usable time.Time
}

func (r *clusterRow) setTarget(i int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.target = i
}

func (r *clusterRow) targetNow() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.target
}

// mark sets from to now.
func (r *clusterRow) mark() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.from = time.Now()
}

func (r *clusterRow) markedAt() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.from
}

// attempt is one Acquire of a waiter.
type attempt struct {
	start, end time.Time
	err        error
}

func (r *clusterRow) run(f clusterFault) {
	r.c.session = f.session
	waitersOn, waiters := r.setUp(f)
	faultAt, h := r.fault(f, waitersOn)
	waiters.Wait()
	fenced, stale := r.verdict(f, faultAt, h)
	r.report(f, r.markedAt(), fenced, stale)
}

// setUp opens the row's account, grants the holder its key and queues two
// waiters behind it.
func (r *clusterRow) setUp(f clusterFault) (waitersOn []int, waiters *sync.WaitGroup) {
	t, c := r.t, r.c
	ctx := context.Background()
	key := account.Key(r.id).String()
	if _, err := r.store.Put(ctx, r.id, opening); err != nil {
		t.Fatal(err)
	}
	r.hist.open(r.id, opening)
	var holder lockkit.Locker
	if f.clients != nil {
		holder, waitersOn = f.clients(t, c, r)
	} else {
		holder = c.locker(t, nil)
	}
	lease, err := holder.Acquire(ctx, key, lockkit.WithTTL(time.Minute), lockkit.WithWaitTimeout(30*time.Second))
	if err != nil {
		t.Fatalf("the holder's grant: %v", err)
	}
	r.lease = lease
	waiters = new(sync.WaitGroup)
	for range 2 {
		l := c.locker(t, waitersOn)
		waiters.Add(1)
		go func() { defer waiters.Done(); r.wait(l, key) }()
	}
	time.Sleep(time.Second) // the waiters queue behind the holder
	if r.grantCount() != 0 {
		t.Fatalf("a waiter was granted while the holder held the key")
	}
	return waitersOn, waiters
}

// fault injects f while the holder holds and a probe tries a free key on
// the waiters' members, and returns when the holder is done.
func (r *clusterRow) fault(f clusterFault, waitersOn []int) (faultAt time.Time, h holdResult) {
	var prober lockkit.Locker
	if r.c.kind == "etcd" {
		prober = r.c.locker(r.t, waitersOn)
	}
	faultAt = time.Now()
	held := make(chan holdResult, 1)
	go func() { held <- r.hold(faultAt) }()
	usable := make(chan time.Time, 1)
	go func() { usable <- r.probe(prober, faultAt) }()
	f.inject(r.t, r.c, r)
	h = <-held
	at := <-usable
	r.mu.Lock()
	r.usable = at
	r.mu.Unlock()
	return faultAt, h
}

// verdict checks how the holder's lease ended and, if it was lost, sends
// the holder's late write, which the fence must refuse.
func (r *clusterRow) verdict(f clusterFault, faultAt time.Time, h holdResult) (fenced int, stale string) {
	t := r.t
	if r.c.kind == "zookeeper" && f.suspends {
		// go-zookeeper sees a closed connection at once, and a silent one
		// after 2/3 of the session: either way before the session can
		// expire on the servers.
		if h.lostAt.IsZero() || h.lostAt.Sub(faultAt) > cmp.Or(f.session, clusterZKSession)*2/3 {
			t.Errorf("the holder's connection was closed, yet its lease was not lost within 2/3 of the session (lost at %v)",
				h.lostAt.Sub(faultAt))
		}
	}
	granted := firstAfter(r.grants, faultAt).Sub(faultAt).Round(10 * time.Millisecond)
	if h.lostAt.IsZero() {
		if h.write != nil {
			t.Errorf("the holder kept its lease, but its write was refused: %v", h.write)
		}
		return 0, fmt.Sprintf("lease kept, its write %s; a waiter granted at +%v, at its release", errText(h.write), granted)
	}
	// A holder that lost its lease but writes anyway, late: a pause
	// between its last check and its write, which no lock prevents.
	late := r.deposit(r.lease.Fence(), 1000)
	if errors.Is(late, lockkit.ErrFenced) {
		fenced = 1
	} else {
		t.Errorf("the late write of a holder whose lease was lost, after a new holder's write: %v, want ErrFenced", late)
	}
	return fenced, fmt.Sprintf("Lost at +%v, a waiter granted at +%v; late write %s",
		h.lostAt.Sub(faultAt).Round(10*time.Millisecond), granted, errText(late))
}

// probe is a client beside the holder and the waiters: from the fault on,
// it tries a free key with a 1 s wait, until an Acquire begun after the
// mark is granted: the instant the cluster's locks are usable again. (The
// waiters' grants come later than that by design: after the holder's
// lease is lost or released.) On etcd it is one client, opened before the
// fault (a new client, whose session is granted during the election, took
// 5-12 s more). On ZooKeeper it opens a new client for each try on the
// members the fault spared, so that the probe measures the ensemble, not
// one client's reconnect schedule.
func (r *clusterRow) probe(l lockkit.Locker, faultAt time.Time) time.Time {
	key := fmt.Sprintf("usable-probe-%d", r.id)
	for time.Since(faultAt) < 90*time.Second {
		start := time.Now()
		if at, ok := r.probeOnce(l, key); ok {
			if from := r.markedAt(); !from.IsZero() && start.After(from) {
				return at
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Errorf("no free key was granted within 90s of the fault")
	return time.Time{}
}

// probeOnce locks key with l, or with a new client if l is nil.
func (r *clusterRow) probeOnce(l lockkit.Locker, key string) (time.Time, bool) {
	if l == nil {
		fresh, err := r.c.open(others(r.targetNow()))
		if err != nil {
			return time.Time{}, false
		}
		defer fresh.Close()
		l = fresh
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, key)
	if err != nil {
		return time.Time{}, false
	}
	at := time.Now()
	_ = lease.Release(ctx)
	return at, true
}

// onFollower opens the holder's client so that it talks to a follower,
// the member the row kills, and names the other two for the waiters.
// ZooKeeper: a client keeps one connection, to a member it picks at
// random, found here by the members' connection counts (the holder's
// client is the only one open); it is opened again until that member is a
// follower. etcd: a client spreads its calls over every member it is
// given, so the holder's is given all three, and one of the followers is
// killed under it.
func onFollower(t *testing.T, c *cluster, r *clusterRow) (lockkit.Locker, []int) {
	leader := c.leader(t)
	if c.kind == "etcd" {
		r.target = (leader + 1) % 3
		return c.locker(t, nil), others(r.target)
	}
	ctx := context.Background()
	for range 20 {
		l := c.locker(t, nil)
		for i, m := range c.members {
			if n, err := zkConnections(ctx, m.addr); err == nil && n > 1 && i != leader {
				r.target = i
				return l, others(i)
			}
		}
		_ = l.Close()
	}
	t.Fatalf("the holder's client never connected to a follower in 20 tries")
	return nil, nil
}

type holdResult struct {
	lostAt time.Time // zero if the lease was never lost
	write  error     // the holder's own write, when it kept its lease
}

// hold is the holder from the fault on: it keeps the key for clusterHold
// and then writes and releases, unless Lost closes first; then it
// releases at once (in the background, as lockkit.Do does), and its write
// comes later, from run.
func (r *clusterRow) hold(faultAt time.Time) holdResult {
	select {
	case <-r.lease.Lost():
		lostAt := time.Now()
		r.setReleased()
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			_ = r.lease.Release(ctx)
		}()
		return holdResult{lostAt: lostAt}
	case <-time.After(time.Until(faultAt.Add(clusterHold))):
	}
	write := r.deposit(r.lease.Fence(), 1)
	r.setReleased()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = r.lease.Release(ctx)
	return holdResult{write: write}
}

func (r *clusterRow) setReleased() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.released = true
}

// wait is one waiter: Acquire until granted (each attempt bounded by
// clusterAttempt, at most 90 s in all), write under the grant, release.
func (r *clusterRow) wait(l lockkit.Locker, key string) {
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		a := attempt{start: time.Now()}
		ctx, cancel := context.WithTimeout(context.Background(), clusterAttempt)
		lease, err := l.Acquire(ctx, key, lockkit.WithTTL(time.Minute))
		cancel()
		a.end, a.err = time.Now(), err
		r.mu.Lock()
		r.attempts = append(r.attempts, a)
		if err == nil {
			r.grants = append(r.grants, a.end)
			if !r.released && !backend.IsClosed(r.lease.Lost()) {
				r.overlap++
			}
		}
		r.mu.Unlock()
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if err := r.deposit(lease.Fence(), 10); err != nil {
			r.t.Errorf("a new holder's write (token %d) was refused: %v", lease.Fence(), err)
		}
		ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
		_ = lease.Release(ctx)
		cancel()
		return
	}
	r.t.Errorf("a waiter was not granted the key within 90s")
}

func (r *clusterRow) grantCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.grants)
}

// deposit writes amount to the row's account with fence, through the
// fenced store, and records it in the history: a refusal changed nothing
// and is left out; an error of another kind has an unknown outcome.
func (r *clusterRow) deposit(fence uint64, amount int64) error {
	var balance int64
	call := time.Now()
	err := r.store.Update(context.Background(), "deposit", []int64{r.id}, map[int64]uint64{r.id: fence},
		func(_ context.Context, a []*account.Account) error {
			a[0].Balance += amount
			balance = a[0].Balance
			return nil
		})
	out := accOutput{Balance: balance}
	switch {
	case errors.Is(err, lockkit.ErrFenced):
		return err
	case err != nil:
		out = accOutput{Unknown: true}
	}
	r.hist.add(r.id, accInput{Kind: "deposit", Amount: amount}, out, call, time.Now())
	return err
}

// add records an operation made in this process, not through a shop.
func (h *history) add(id int64, in accInput, out accOutput, call, ret time.Time) {
	op := porcupine.Operation{Input: in, Output: out, Call: int64(call.Sub(h.start)), Return: int64(ret.Sub(h.start))}
	if out.Unknown {
		op.Return = math.MaxInt64 / 2
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	op.ClientId = h.clients
	h.clients++
	h.ops[id] = append(h.ops[id], op)
}

// report reads the balance back, checks the row and adds it to the table.
func (r *clusterRow) report(f clusterFault, from time.Time, fenced int, stale string) {
	t := r.t
	ctx := context.Background()
	call := time.Now()
	a, err := r.store.Get(ctx, r.id)
	if err != nil {
		t.Fatal(err)
	}
	r.hist.add(r.id, accInput{Kind: "get"}, accOutput{Balance: a.Balance}, call, time.Now())
	drift, err := r.store.Drift(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lin, verdict := r.hist.check(r.id)
	r.mu.Lock()
	defer r.mu.Unlock()
	res := row{Fault: f.name, Backend: r.c.kind + " x3", Overlap: r.overlap, Fenced: fenced,
		LostCents: drift[fmt.Sprint(r.id)], Linearizable: verdict, Stale: stale}
	if !r.usable.IsZero() {
		res.Recovery = r.usable.Sub(from)
	}
	if failed := failedAttempts(r.attempts); failed != "none" {
		res.Stale += "; waiters' failed attempts: " + failed
	}
	if r.probes != "" {
		res.Stale += "; " + r.probes
	}
	report(res)
	t.Logf("%+v", res)

	if r.overlap != 0 {
		t.Errorf("%d waiters were granted while the holder's lease was live and unreleased", r.overlap)
	}
	if res.LostCents != 0 || !lin {
		t.Errorf("lost updates: drift %d, linearizable %s\n%s", res.LostCents, verdict, r.hist.describe(r.id))
	}
	if len(r.grants) != 2 {
		t.Errorf("%d of 2 waiters were granted", len(r.grants))
	}
}

func firstAfter(ts []time.Time, from time.Time) time.Time {
	var first time.Time
	for _, g := range ts {
		if g.After(from) && (first.IsZero() || g.Before(first)) {
			first = g
		}
	}
	return first
}

// failedAttempts counts failed Acquires by error.
func failedAttempts(as []attempt) string {
	n := map[string]int{}
	for _, a := range as {
		if a.err != nil {
			n[attemptError(a.err)]++
		}
	}
	return counts(n)
}

// attemptError names what a failed Acquire said, by lockkit's sentinels.
func attemptError(err error) string {
	for _, e := range []error{lockkit.ErrUnavailable, lockkit.ErrNotAcquired, lockkit.ErrClosed, context.DeadlineExceeded} {
		if errors.Is(err, e) {
			return strings.TrimPrefix(e.Error(), "lockkit: ")
		}
	}
	return "other: " + err.Error()
}

// quorumLoss stops two members (SIGTERM) while the holder holds and the
// waiters wait, keeps them down for quorumDown once both have exited, and
// starts them again. It marks the instant they were started again. While
// it is lost, a client of its own tries a free key again and again, each
// Acquire with a 2 s wait: none may succeed, and each must fail within its
// wait plus the client's own request bound (ZooKeeper's calls take no
// context: a request in flight ends at its read timeout, 2/3 of the
// session) with one of lockkit's errors. Nor may a waiter be granted.
func quorumLoss(t *testing.T, c *cluster, r *clusterRow) {
	const wait = 2 * time.Second
	bound := wait + time.Second
	if c.kind == "zookeeper" {
		bound += clusterZKSession * 2 / 3
	}
	prober := c.locker(t, nil)
	down := others(c.leader(t))
	signalled := time.Now()
	for _, i := range down {
		c.members[i].stop(syscall.SIGTERM)
	}
	// The quorum is lost once the second member has exited, not when it
	// was signalled: a member shutting down still acks the leader's
	// writes, and a waiter granted by one of those was granted lawfully.
	lostAt := time.Now()
	t.Logf("two members signalled, exited %v later", lostAt.Sub(signalled).Round(time.Millisecond))
	var probes []attempt
	for time.Since(lostAt) < quorumDown {
		a := attempt{start: time.Now()}
		ctx, cancel := context.WithTimeout(context.Background(), wait)
		lease, err := prober.Acquire(ctx, fmt.Sprintf("quorum-probe-%d", r.id))
		cancel()
		a.end, a.err = time.Now(), err
		probes = append(probes, a)
		if err == nil {
			_ = lease.Release(context.Background())
		}
		time.Sleep(100 * time.Millisecond) // a client backing off, not spinning
	}
	r.mark()
	back := r.markedAt()
	for _, i := range down {
		c.members[i].launch()
	}
	for _, i := range down {
		c.members[i].awaitReady()
	}
	r.checkNoQuorum(probes, lostAt, back, bound)
}

// checkNoQuorum holds the probes and the waiters' attempts made without a
// quorum to quorumLoss's rules, and notes the probes for the row.
func (r *clusterRow) checkNoQuorum(probes []attempt, lostAt, back time.Time, bound time.Duration) {
	t := r.t
	var longest time.Duration
	for _, a := range probes {
		longest = max(longest, a.end.Sub(a.start))
		switch {
		case a.err == nil:
			t.Errorf("an Acquire succeeded %v after the quorum was lost", a.end.Sub(lostAt).Round(time.Millisecond))
		case a.start.After(lostAt.Add(quorumNoticed)) && !errors.Is(a.err, lockkit.ErrUnavailable):
			// The caller's own deadline, or ErrNotAcquired, would tell
			// it that someone holds the key.
			t.Errorf("an Acquire begun %v after the quorum was lost failed with %q; want ErrUnavailable",
				a.start.Sub(lostAt).Round(time.Millisecond), a.err)
		}
	}
	if longest > bound {
		t.Errorf("an Acquire without a quorum took %v to fail; want at most %v", longest, bound)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, g := range r.grants {
		if g.After(lostAt) && g.Before(back) {
			t.Errorf("a waiter was granted %v after the quorum was lost, before it was back", g.Sub(lostAt).Round(time.Millisecond))
		}
	}
	r.probes = fmt.Sprintf("no quorum for %v: %d probes failed (%s), the longest in %v",
		back.Sub(lostAt).Round(100*time.Millisecond), len(probes), failedAttempts(probes), longest.Round(10*time.Millisecond))
	if len(probes) > 0 {
		t.Logf("without a quorum, Acquire said: %v", probes[len(probes)-1].err)
	}
}
