package faults

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit/backend"
	"github.com/lockbench/shop/internal/shoptest"
)

// netns is a network namespace this test made, joined to the host by a
// veth pair with link-local addresses: both ends are this test's own hosts.
type netns struct {
	t          testing.TB
	name, veth string // veth is the namespace's end
	// host and lock are addresses of the host end (the lock server is
	// reached through lock only, so that it can be cut off alone), inside
	// the namespace's end.
	host, lock, inside string
}

func sh(args ...string) error {
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// newNetns creates the namespace, or fails the test: a machine that cannot
// (no root, no CAP_NET_ADMIN, no iproute2) cannot run the partition fault,
// and that must not pass as success.
func newNetns(t *testing.T) *netns {
	t.Helper()
	n := rand.IntN(250) + 1
	id := shoptest.Random(3)
	ns := &netns{t: t, name: "shopfaults-" + id, veth: "vfn" + id,
		host: fmt.Sprintf("169.254.%d.1", n), inside: fmt.Sprintf("169.254.%d.2", n), lock: fmt.Sprintf("169.254.%d.3", n)}
	hostEnd := "vfh" + id
	steps := [][]string{
		{"ip", "netns", "add", ns.name},
		{"ip", "link", "add", hostEnd, "type", "veth", "peer", "name", ns.veth},
		{"ip", "link", "set", ns.veth, "netns", ns.name},
		{"ip", "addr", "add", ns.host + "/29", "dev", hostEnd},
		{"ip", "addr", "add", ns.lock + "/29", "dev", hostEnd},
		{"ip", "link", "set", hostEnd, "up"},
		{"ip", "netns", "exec", ns.name, "ip", "addr", "add", ns.inside + "/29", "dev", ns.veth},
		{"ip", "netns", "exec", ns.name, "ip", "link", "set", ns.veth, "up"},
		{"ip", "netns", "exec", ns.name, "ip", "link", "set", "lo", "up"},
	}
	t.Cleanup(func() {
		_ = sh("ip", "link", "del", hostEnd) // deletes both ends
		_ = sh("ip", "netns", "del", ns.name)
	})
	for _, s := range steps {
		if err := sh(s...); err != nil {
			t.Fatalf("the partition fault needs root and iproute2 (network namespaces, veth): %v", err)
		}
	}
	return ns
}

// cut routes everything the namespace sends to the lock address into a
// blackhole: the instance inside keeps its database and its clients, and
// loses only its lock server, silently (no reset, no ICMP), as in a
// partition. (tc would do it per port, but this kernel has no prio or
// netem qdisc.)
func (ns *netns) cut() {
	ns.t.Helper()
	if err := sh("ip", "netns", "exec", ns.name, "ip", "route", "add", "blackhole", ns.lock+"/32"); err != nil {
		ns.t.Fatal(err)
	}
}

// wrapper returns an executable that runs bin inside the namespace, for
// shoptest.Start.
func (ns *netns) wrapper(bin string) string {
	ns.t.Helper()
	path := filepath.Join(ns.t.TempDir(), "shop-in-"+ns.name)
	script := fmt.Sprintf("#!/bin/sh\nexec ip netns exec %s %s \"$@\"\n", ns.name, bin)
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		ns.t.Fatal(err)
	}
	return path
}

// proxy forwards TCP from listen (on the host end of the veth) to target
// (a shared server on loopback), so the instance in the namespace reaches
// the same servers as the others, through a link the test can cut.
func proxy(t *testing.T, listen, target string) int {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(listen, "0"))
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
		wg    sync.WaitGroup
	)
	track := func(c net.Conn) { mu.Lock(); conns = append(conns, c); mu.Unlock() }
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.DialTimeout("tcp", target, 5*time.Second)
			if err != nil {
				in.Close()
				continue
			}
			track(in)
			track(out)
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(out, in); out.Close() }()
			go func() { defer wg.Done(); _, _ = io.Copy(in, out); in.Close() }()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().(*net.TCPAddr).Port
}

// TestPartition is fault 5: a shop instance in its own network namespace
// holds lock:account:1, inside a long critical section, when its link to
// the lock server is cut. Its Lost must fire, and its request end refused,
// before another instance is granted the key; nothing may be lost. The
// session-based backends are the ones where a partition, not a TTL, is what
// ends a lease.
func TestPartition(t *testing.T) {
	needFull(t)
	for _, backend := range []string{"zookeeper", "etcd"} {
		t.Run(backend, func(t *testing.T) {
			t.Parallel()
			partitionFault(t, backend)
		})
	}
}

func partitionFault(t *testing.T, backend string) {
	ns := newNetns(t)
	shared := lockEnv(t, backend)
	addrVar := map[string]string{"zookeeper": "SHOP_ZK_ADDRS", "etcd": "SHOP_ETCD_ENDPOINTS"}[backend]
	target := shared[addrVar]
	lockPort := proxy(t, ns.lock, target)
	r := newRig(t, map[string]string{
		"SHOP_LOCK_BACKEND": backend, addrVar: target,
		// Long enough that only the partition can end a's lease.
		"SHOP_LOCK_TTL": "60s", "SHOP_CRITICAL_SECTION_DELAY": "200ms",
	})
	b := r.start()
	const id = 1
	r.account(b.URL, id, opening)

	a := startInNamespace(t, r, ns, addrVar, lockPort)

	aDep, _, aWait := r.enterDeposit(a, id, 100)
	lostBefore, err := r.metric(a.URL, "shop_lock_lost_total")
	if err != nil {
		t.Fatal(err)
	}
	cut := time.Now()
	ns.cut()
	// a's answer comes only after its release, which the partition makes
	// wait for its timeout; the moment its work was cancelled is when its
	// lost-lease counter moves (the instrument wrapper counts it as Release begins).
	aLost := watchLeaseLost(r, a.URL, lostBefore, cut)
	bWaited := r.waited(b)
	bDep := r.hist.do(context.Background(), r.client, b.URL, r.token(id), id, accInput{Kind: "deposit", Amount: 10})
	bGranted := bDep.Call.Add(r.waited(b) - bWaited)
	aWait()
	lostAt, ok := <-aLost
	if !ok {
		t.Fatalf("the cut-off holder never counted its lease as lost; it answered %s", aDep)
	}
	r.hist.do(context.Background(), r.client, b.URL, r.token(id), id, accInput{Kind: "get"})

	audit := r.audit(b.URL)
	lin, verdict := r.hist.check(id)
	lost := audit.BalanceDrift.ByAccount["1"]
	margin := bGranted.Sub(lostAt)
	res := row{Fault: "5 partition (netns)", Backend: backend, LostCents: lost, Linearizable: verdict,
		Recovery: bGranted.Sub(cut),
		Stale: fmt.Sprintf("deposit %s; Lost %v after the cut, %v before b's grant",
			aDep, lostAt.Sub(cut).Round(10*time.Millisecond), margin.Round(10*time.Millisecond))}
	if aDep.Type == "fenced" {
		res.Fenced = 1
	}
	report(res)
	t.Logf("%+v", res)

	if bDep.Status != 200 {
		t.Fatalf("b's deposit: %s", bDep)
	}
	if !aDep.refused() || aDep.Status != 503 {
		t.Errorf("the cut-off holder answered %s; want 503 (lease lost or fenced)", aDep)
	}
	// a's Lost fires from its own clock (send time of its last renewal +
	// session TTL); b is granted once the server has expired a's session,
	// which by construction is later. Both instants are observed from
	// outside, each up to some tens of ms late, hence the tolerance.
	if margin < -100*time.Millisecond {
		t.Errorf("b was granted %v before the cut-off holder's lease was lost", -margin)
	}
	if lost != 0 || !lin {
		t.Errorf("partition lost updates: drift %d, linearizable %s\n%s", lost, verdict, r.hist.describe(id))
	}
}

// startInNamespace starts another instance of r's service in ns, reaching
// the lock server (addrVar) through the proxy on lockPort and MariaDB
// through one of its own; its 40 s critical section is still running when
// the partition cuts it off.
func startInNamespace(t *testing.T, r *rig, ns *netns, addrVar string, lockPort int) *shoptest.Instance {
	t.Helper()
	dbPort := proxy(t, ns.host, "127.0.0.1:3306")
	aEnv := map[string]string{}
	for k, v := range r.env {
		aEnv[k] = v
	}
	aEnv["SHOP_HTTP_ADDR"] = ns.inside + ":0"
	aEnv[addrVar] = fmt.Sprintf("%s:%d", ns.lock, lockPort)
	aEnv["SHOP_MYSQL_DSN"] = strings.Replace(r.env["SHOP_MYSQL_DSN"], "127.0.0.1:3306", fmt.Sprintf("%s:%d", ns.host, dbPort), 1)
	aEnv["SHOP_CRITICAL_SECTION_DELAY"] = "40s"
	return shoptest.Start(t, ns.wrapper(r.bin), aEnv)
}

// watchLeaseLost sends when the instance at url counts a lease lost
// beyond lostBefore, or closes if it does not within 60 s of cut.
func watchLeaseLost(r *rig, url string, lostBefore float64, cut time.Time) <-chan time.Time {
	lost := make(chan time.Time, 1)
	go func() {
		for time.Since(cut) < 60*time.Second {
			if v, err := r.metric(url, "shop_lock_lost_total"); err == nil && v > lostBefore {
				lost <- time.Now()
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
		close(lost)
	}()
	return lost
}

// enterDeposit sends a deposit to in and returns once in holds the account
// lock.
func (r *rig) enterDeposit(in *shoptest.Instance, id, amount int64) (dep *outcome, _ struct{}, wait func()) {
	r.t.Helper()
	before := r.grants(in, lockkey.Account)
	dep = new(outcome)
	done := make(chan struct{})
	go func() {
		defer close(done)
		*dep = r.hist.do(context.Background(), r.client, in.URL, r.token(id), id, accInput{Kind: "deposit", Amount: amount})
	}()
	deadline := time.Now().Add(60 * time.Second)
	for r.grants(in, lockkey.Account) < before+1 {
		if backend.IsClosed(done) || time.Now().After(deadline) {
			r.t.Fatalf("%s did not take the lock: %s", in.URL, dep)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return dep, struct{}{}, func() { <-done }
}
