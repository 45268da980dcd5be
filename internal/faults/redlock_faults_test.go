package faults

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/account"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/lockkit/redlock"
)

// holderFault makes a lock server forget a live holder's grant without
// the holder knowing: the two events Redlock's safety argument assumes
// away (M. Kleppmann, "How to do distributed locking", 2016).
type holderFault struct {
	name   string
	inject func(s *clockRedis)
}

var holderFaults = []holderFault{
	{"10 holder's master restarted empty", (*clockRedis).restartEmpty},
	{"11 holder's master's clock jumps", func(s *clockRedis) { s.jump(clockJump) }},
}

const (
	// grantTTL is every grant's TTL: much longer than a row takes, so
	// only the fault ends a grant on a server, and a holder's own lease
	// stays live throughout.
	grantTTL = time.Minute
	// clockJump is how far the fault moves a server's wall clock: past
	// grantTTL, so that the server's copy of the grant expires.
	clockJump = 10 * time.Minute
)

// TestHolderMasterFaults is faults 10 and 11. Redlock: three private
// masters; a is granted while the third is cut off, so its grant stands on
// exactly a majority; one of those two forgets it (restarted without
// persistence, or its clock jumps past the TTL); the third comes back, and
// b is granted by the two that do not hold a's value, while a's lease is
// live. Beside it, the fenced Redis lock on one server through the same
// fault: the second grant happens there too, and the store's fence is what
// keeps the account whole. In each row a and b then deposit into one
// account at once, a reading first and writing first, as two holders do.
func TestHolderMasterFaults(t *testing.T) {
	t.Parallel()
	lib := clockShiftLib(t)
	store := accountStore(t)
	for i, f := range holderFaults {
		t.Run(f.name, func(t *testing.T) {
			t.Run("redlock", func(t *testing.T) {
				redlockHolderRow(t, f, lib, &holders{t: t, store: store, id: int64(2*i + 1)})
			})
			t.Run("redis", func(t *testing.T) {
				fencedHolderRow(t, f, lib, &holders{t: t, store: store, id: int64(2*i + 2)})
			})
		})
	}
}

func redlockHolderRow(t *testing.T, f holderFault, lib string, h *holders) {
	ctx := context.Background()
	masters := []*clockRedis{newClockRedis(t, lib), newClockRedis(t, lib), newClockRedis(t, lib)}
	third := newGate(t, masters[2].addr)
	addrs := []string{masters[0].addr, masters[1].addr, third.addr()}
	la, lb := redlock.New(dialAll(t, addrs)), redlock.New(dialAll(t, addrs))
	defer la.Close()
	defer lb.Close()
	direct := dialAll(t, []string{masters[0].addr, masters[1].addr, masters[2].addr})
	h.open()

	third.setCut(true)
	h.a = h.acquire(la)
	granted := values(direct, h.key())
	f.inject(masters[1])
	third.setCut(false)
	h.b = h.acquire(lb)
	after := values(direct, h.key())
	h.depositBoth()
	_ = h.a.Release(ctx)
	_ = h.b.Release(ctx)

	stale := fmt.Sprintf("a granted by masters %s (3 cut off), b by %s; live holders %d; deposits: a %s, b %s",
		grantedBy(granted, granted[0]), grantedBy(after, after[2]), h.live, errText(h.aWrite), errText(h.bWrite))
	res := h.report(f.name, "redlock x3", stale)
	if grantedBy(granted, granted[0]) != "1,2" || grantedBy(after, after[2]) != "2,3" || after[0] != granted[0] {
		t.Errorf("the masters' values: %q after a's grant, %q after b's; want a's on 1,2, then a's on 1 and b's on 2,3", granted, after)
	}
	if h.live != 2 {
		t.Errorf("%d live holders after b's grant, want 2", h.live)
	}
	if h.aWrite != nil || h.bWrite != nil {
		t.Errorf("a lock without a fence cannot refuse a write; got a: %v, b: %v", h.aWrite, h.bWrite)
	}
	if res.LostCents != -aDeposit || h.linearizable {
		t.Errorf("b's write over a's should lose a's %d cents and break linearizability; drift %d, linearizable %s\n%s",
			aDeposit, res.LostCents, res.Linearizable, h.hist.describe(h.id))
	}
}

func fencedHolderRow(t *testing.T, f holderFault, lib string, h *holders) {
	ctx := context.Background()
	s := newClockRedis(t, lib)
	la, lb := redisLocker(t, s.addr), redisLocker(t, s.addr)
	h.open()

	h.a = h.acquire(la)
	f.inject(s)
	h.b = h.acquire(lb)
	h.depositBoth()
	_ = h.a.Release(ctx)
	_ = h.b.Release(ctx)

	stale := fmt.Sprintf("tokens a=%d b=%d; live holders %d; deposits: a %s, b %s",
		h.a.Fence(), h.b.Fence(), h.live, errText(h.aWrite), errText(h.bWrite))
	res := h.report(f.name, "redis", stale)
	if h.b.Fence() <= h.a.Fence() {
		t.Errorf("b granted token %d after a's %d", h.b.Fence(), h.a.Fence())
	}
	if !errors.Is(h.aWrite, lockkit.ErrFenced) || h.bWrite != nil {
		t.Errorf("the fence should refuse a's write and accept b's; got a: %v, b: %v", h.aWrite, h.bWrite)
	}
	if res.LostCents != 0 || !h.linearizable {
		t.Errorf("the fenced store lost an update: drift %d, linearizable %s\n%s", res.LostCents, res.Linearizable, h.hist.describe(h.id))
	}
}

// dialAll opens one client per address, as a Redlock client should (see
// redlock.New), closed when t ends.
func dialAll(t *testing.T, addrs []string) []redis.UniversalClient {
	clients := make([]redis.UniversalClient, len(addrs))
	for i, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialerRetries: 1, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		clients[i] = c
	}
	return clients
}

func redisLocker(t *testing.T, addr string) lockkit.Locker {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	l, err := redislock.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// values reads key on each master ("" where it is absent).
func values(clients []redis.UniversalClient, key string) []string {
	vs := make([]string, len(clients))
	for i, c := range clients {
		vs[i], _ = c.Get(context.Background(), key).Result()
	}
	return vs
}

// grantedBy names the masters (from 1) holding value v.
func grantedBy(vs []string, v string) string {
	var on []string
	for i, x := range vs {
		if v != "" && x == v {
			on = append(on, fmt.Sprint(i+1))
		}
	}
	return strings.Join(on, ",")
}

// The deposits of a and b: different amounts, so that the balance tells
// whose write survived.
const (
	aDeposit = 10
	bDeposit = 100
)

// holders is one row of faults 10 and 11: a's grant, the fault, b's
// grant, and both holders' deposits into account id.
type holders struct {
	t     *testing.T
	store *account.Store
	hist  *history
	id    int64
	a, b  lockkit.Lease
	// live counts the leases not lost when b was granted.
	live           int
	aWrite, bWrite error
	linearizable   bool
}

func (h *holders) key() string { return account.Key(h.id).String() }

func (h *holders) open() {
	h.t.Helper()
	h.hist = newHistory()
	if _, err := h.store.Put(context.Background(), h.id, opening); err != nil {
		h.t.Fatal(err)
	}
	h.hist.open(h.id, opening)
}

func (h *holders) acquire(l lockkit.Locker) lockkit.Lease {
	h.t.Helper()
	lease, err := l.Acquire(context.Background(), h.key(), lockkit.WithTTL(grantTTL), lockkit.WithWaitTimeout(10*time.Second))
	if err != nil {
		h.t.Fatalf("acquire %s: %v", h.key(), err)
	}
	if h.a != nil {
		h.live = 1
		if !backend.IsClosed(h.a.Lost()) {
			h.live++
		}
	}
	return lease
}

// depositBoth runs a's and b's read-modify-writes the way two holders
// interleave: a reads, b reads, a writes, b writes. Without a fence b's
// write overwrites a's from a stale read; with one, b's claim of the row
// refuses a's write.
func (h *holders) depositBoth() {
	aRead, bRead, bGone, aDone := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(aDone)
		h.aWrite = h.deposit(h.a, aDeposit, func() {
			close(aRead)
			select {
			case <-bRead:
			case <-bGone: // b was refused before reading
			}
		})
	}()
	<-aRead
	h.bWrite = h.deposit(h.b, bDeposit, func() { close(bRead); <-aDone })
	close(bGone)
	<-aDone
}

// deposit adds amount to the account under lease, calling between after
// its read, and records it in the history (a refusal changed nothing and
// is left out; another error is of unknown outcome).
func (h *holders) deposit(lease lockkit.Lease, amount int64, between func()) error {
	var balance int64
	call := time.Now()
	err := h.store.Update(context.Background(), "deposit", []int64{h.id}, map[int64]uint64{h.id: lease.Fence()},
		func(_ context.Context, a []*account.Account) error {
			between()
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
	h.hist.add(h.id, accInput{Kind: "deposit", Amount: amount}, out, call, time.Now())
	return err
}

// report reads the balance back into the history, checks it, and adds the
// row to the table.
func (h *holders) report(fault, backendName, stale string) row {
	h.t.Helper()
	ctx := context.Background()
	call := time.Now()
	a, err := h.store.Get(ctx, h.id)
	if err != nil {
		h.t.Fatal(err)
	}
	h.hist.add(h.id, accInput{Kind: "get"}, accOutput{Balance: a.Balance}, call, time.Now())
	drift, err := h.store.Drift(ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	var verdict string
	h.linearizable, verdict = h.hist.check(h.id)
	// OVERLAP counts grants made while another was live, as in fault 4.
	res := row{Fault: fault, Backend: backendName, Overlap: h.live - 1, LostCents: drift[fmt.Sprint(h.id)],
		Linearizable: verdict, Stale: stale}
	if errors.Is(h.aWrite, lockkit.ErrFenced) {
		res.Fenced = 1
	}
	report(res)
	h.t.Logf("%+v", res)
	return res
}
