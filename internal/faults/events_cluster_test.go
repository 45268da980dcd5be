package faults

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/lockbench/shop/internal/events"
	"github.com/lockbench/shop/internal/testenv"
)

// natsCluster is a 3-node JetStream cluster of the test's own (the shared
// one serves other packages' tests): nodes can be killed, restarted with
// their stores, and frozen.
type natsCluster struct {
	t     *testing.T
	bin   string
	nodes []*natsNode
}

type natsNode struct {
	name, conf string
	port       int
	cmd        *exec.Cmd
	done       chan struct{}
}

func startNATSCluster(t *testing.T) *natsCluster {
	t.Helper()
	c := &natsCluster{t: t, bin: testenv.Require(t, testenv.NATSServerVar)}
	dir := t.TempDir()
	var routes []string
	routePorts := make([]int, 3)
	for i := range routePorts {
		routePorts[i] = freeLoopbackPort(t)
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", routePorts[i]))
	}
	for i := range 3 {
		n := &natsNode{name: fmt.Sprintf("n%d", i), port: freeLoopbackPort(t), conf: filepath.Join(dir, fmt.Sprintf("n%d.conf", i))}
		body := fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:%d\njetstream { store_dir: %q }\n"+
			"cluster { name: shop-faults, listen: 127.0.0.1:%d, routes: [%s] }\n",
			n.name, n.port, filepath.Join(dir, n.name), routePorts[i], strings.Join(routes, ", "))
		if err := os.WriteFile(n.conf, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		c.nodes = append(c.nodes, n)
	}
	for i := range c.nodes {
		c.start(i)
	}
	t.Cleanup(func() {
		for i := range c.nodes {
			c.kill(i)
		}
	})
	return c
}

func freeLoopbackPort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func (c *natsCluster) url(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", c.nodes[i].port) }

func (c *natsCluster) urls() string {
	var u []string
	for i := range c.nodes {
		u = append(u, c.url(i))
	}
	return strings.Join(u, ",")
}

// start starts node i (again, with its store) and waits until it accepts
// connections.
func (c *natsCluster) start(i int) {
	c.t.Helper()
	n := c.nodes[i]
	n.cmd = exec.Command(c.bin, "-c", n.conf)
	if err := n.cmd.Start(); err != nil {
		c.t.Fatalf("start nats-server %s: %v", n.name, err)
	}
	n.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(n.cmd, n.done)
	waitUntil(c.t, "nats-server "+n.name+" accepts connections", func() bool {
		conn, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", n.port), time.Second)
		if err == nil {
			conn.Close()
		}
		return err == nil
	})
}

// kill SIGKILLs node i (continued first, should it be frozen) and waits
// until it is gone.
func (c *natsCluster) kill(i int) {
	n := c.nodes[i]
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(syscall.SIGCONT)
	_ = n.cmd.Process.Kill()
	<-n.done
	n.cmd = nil
}

func (c *natsCluster) signal(i int, sig syscall.Signal) {
	c.t.Helper()
	if err := c.nodes[i].cmd.Process.Signal(sig); err != nil {
		c.t.Fatal(err)
	}
}

// streamLeader returns the node that leads the events stream.
func (c *natsCluster) streamLeader(js jetstream.JetStream) int {
	c.t.Helper()
	leader := -1
	waitUntil(c.t, "the stream has a leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, events.Stream)
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		if err != nil || info.Cluster == nil {
			return false
		}
		for i, n := range c.nodes {
			if n.name == info.Cluster.Leader {
				leader = i
			}
		}
		return leader >= 0
	})
	return leader
}

// stalled returns the longest time from since on during which the relay
// marked no event published, read from the outbox's marks (millisecond
// timestamps written on the broker's acknowledgement).
func (r *eventsRig) stalled(since time.Time) time.Duration {
	r.t.Helper()
	var marks []time.Time
	err := r.db.Model(&events.OutboxRow{}).Where("published_at >= ?", since.UTC()).
		Order("published_at").Pluck("published_at", &marks).Error
	if err != nil {
		r.t.Fatal(err)
	}
	longest, prev := time.Duration(0), since
	for _, m := range marks {
		longest, prev = max(longest, m.Sub(prev)), m
	}
	return longest
}

// streamFault is a fault of the cluster, given the stream's leader and
// the node shop is connected to; it returns what undoes it.
type streamFault struct {
	name string
	// onLeader connects shop to the stream's leader rather than to a
	// follower that stays up.
	onLeader bool
	inject   func(c *natsCluster, leader, shopNode int) (restore func())
}

// TestEventStreamClusterFaults runs orders against a 3-node JetStream
// cluster with the stream at 3 replicas, and takes the stream's leader
// away under them: SIGKILLed and restarted; frozen with SIGSTOP (alive to
// the kernel, its sockets open, silent to its peers and clients: a node
// cut off) and continued; two of three nodes killed (the quorum lost) and
// restarted. shop is connected to a follower that stays up, so these rows
// measure the cluster's recovery; a last row freezes the leader shop is
// connected to, which measures the client's. Every order is answered 201,
// every event reaches the stream once, the audit is clean; how long
// publishing stalled is measured and reported, not asserted.
func TestEventStreamClusterFaults(t *testing.T) {
	needFull(t)
	const outage = 12 * time.Second // longer than a JetStream election, so a failover shows
	freeze := func(c *natsCluster, leader, _ int) func() {
		c.signal(leader, syscall.SIGSTOP)
		return func() { c.signal(leader, syscall.SIGCONT) }
	}
	for _, f := range []streamFault{
		{"stream leader SIGKILLed", false, func(c *natsCluster, leader, _ int) func() {
			c.kill(leader)
			return func() { c.start(leader) }
		}},
		{"stream leader frozen (SIGSTOP)", false, freeze},
		{"quorum lost (2 of 3 SIGKILLed)", false, func(c *natsCluster, leader, shopNode int) func() {
			other := 3 - leader - shopNode
			c.kill(leader)
			c.kill(other)
			return func() { c.start(leader); c.start(other) }
		}},
		{"stream leader, shop's node, frozen (SIGSTOP)", true, freeze},
	} {
		t.Run(f.name, func(t *testing.T) {
			c := startNATSCluster(t)
			r := newEventsRig(t, c.urls(), map[string]string{"SHOP_EVENTS_REPLICAS": "3"})
			waitUntil(t, "the cluster creates the stream at 3 replicas", func() bool {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				defer cancel()
				return events.EnsureStream(ctx, r.js, events.StreamOptions{Replicas: 3,
					DuplicateWindow: events.DefaultDuplicateWindow, MaxAge: events.DefaultMaxAge}) == nil
			})
			leader := c.streamLeader(r.js)
			shopNode := (leader + 1) % 3
			if f.onLeader {
				shopNode = leader
			}
			r.env["SHOP_NATS_URL"] = c.url(shopNode) // the others are learnt from it
			a := r.serve(r.env["SHOP_MYSQL_DSN"])
			r.consume()
			r.stock(a.URL)
			r.mustPlace(a.URL, 3)
			r.drained()

			stop := r.traffic(a.URL)
			time.Sleep(2 * time.Second)
			faultAt := time.Now()
			restore := f.inject(c, leader, shopNode)
			time.Sleep(outage)
			restore()
			time.Sleep(2 * time.Second)
			placed, err := stop()
			if err != nil {
				t.Fatalf("an order under the fault: %v", err)
			}
			r.drained()
			stall := r.stalled(faultAt)
			r.settled(uint64(2 * (placed + 3)))
			row := r.conclude(a.URL, f.name, "3 nodes, R3, outbox, inbox", fmt.Sprintf(
				"%s fault; %d orders under traffic, all 201; no event marked published for %s",
				outage, placed, stall.Round(10*time.Millisecond)))
			mustBeExact(t, row)
		})
	}
}
