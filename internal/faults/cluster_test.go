package faults

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/lockbench/shop/internal/shoptest"
)

// clusterNet is one network namespace per cluster member, each joined by
// a veth pair to a bridge in the host's namespace, all on one link-local
// /28. The test reaches every member through the bridge, as a client
// would; the members reach each other over it without the host routing
// anything. A partition is blackhole routes inside the namespaces: the
// cut-off member still answers the host, that is, its own clients.
type clusterNet struct {
	t      testing.TB
	host   string   // the bridge's address
	ns     []string // namespace of member i
	ips    []string // address of member i
	bridge string
}

// newClusterNet makes the namespaces, or fails the test: a machine that
// cannot (no root, no iproute2) cannot run the cluster faults, and that
// must not pass as success. The /24s 169.254.251-254 are left alone by the
// partition fault (which draws from 1-250); each net takes a random /28.
func newClusterNet(t *testing.T, members int) *clusterNet {
	t.Helper()
	id := shoptest.Random(3)
	base := fmt.Sprintf("169.254.%d.%d", 251+rand.IntN(4), 16*rand.IntN(16))
	at := func(i int) string {
		ip := net.ParseIP(base).To4()
		ip[3] += byte(i)
		return ip.String()
	}
	c := &clusterNet{t: t, host: at(1), bridge: "scb" + id}
	steps := [][]string{
		{"ip", "link", "add", c.bridge, "type", "bridge"},
		{"ip", "addr", "add", c.host + "/28", "dev", c.bridge},
		{"ip", "link", "set", c.bridge, "up"},
	}
	var links []string
	for i := range members {
		ns, hostEnd, nsEnd := fmt.Sprintf("shopcl-%s-%d", id, i), fmt.Sprintf("sch%s%d", id, i), fmt.Sprintf("scn%s%d", id, i)
		c.ns, c.ips, links = append(c.ns, ns), append(c.ips, at(2+i)), append(links, hostEnd)
		steps = append(steps,
			[]string{"ip", "netns", "add", ns},
			[]string{"ip", "link", "add", hostEnd, "type", "veth", "peer", "name", nsEnd},
			[]string{"ip", "link", "set", nsEnd, "netns", ns},
			[]string{"ip", "link", "set", hostEnd, "master", c.bridge},
			[]string{"ip", "link", "set", hostEnd, "up"},
			[]string{"ip", "netns", "exec", ns, "ip", "addr", "add", c.ips[i] + "/28", "dev", nsEnd},
			[]string{"ip", "netns", "exec", ns, "ip", "link", "set", nsEnd, "up"},
			[]string{"ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"},
		)
	}
	t.Cleanup(func() {
		for i, l := range links {
			_ = sh("ip", "link", "del", l) // deletes both ends
			_ = sh("ip", "netns", "del", c.ns[i])
		}
		_ = sh("ip", "link", "del", c.bridge)
	})
	for _, s := range steps {
		if err := sh(s...); err != nil {
			t.Fatalf("the cluster faults need root and iproute2 (network namespaces, veth, bridge): %v", err)
		}
	}
	return c
}

// partition cuts member i off from every other member, both ways, and
// leaves its link to the host alone.
func (c *clusterNet) partition(i int) { c.routes(i, "add") }

// heal undoes partition(i).
func (c *clusterNet) heal(i int) { c.routes(i, "del") }

func (c *clusterNet) routes(i int, verb string) {
	c.t.Helper()
	for j := range c.ips {
		if j == i {
			continue
		}
		for _, r := range [][2]int{{i, j}, {j, i}} {
			if err := sh("ip", "netns", "exec", c.ns[r[0]], "ip", "route", verb, "blackhole", c.ips[r[1]]+"/32"); err != nil {
				c.t.Fatal(err)
			}
		}
	}
}

// cluster is a private 3-member etcd cluster or ZooKeeper ensemble, each
// member a server in its own namespace of net.
type cluster struct {
	kind    string // etcd or zookeeper
	net     *clusterNet
	members []*server
	// isolated is the member a partition cut off, nil when none is.
	isolated *int
	// session is the clients' session of the row that runs, 0 for the
	// shortest (clusterEtcdTTL, clusterZKSession).
	session time.Duration
}

// newCluster starts the members together and returns once each answers as
// a member of a quorum. The members' processes are killed when t ends.
func newCluster(t *testing.T, kind string) *cluster {
	t.Helper()
	c := &cluster{kind: kind, net: newClusterNet(t, 3)}
	for i := range c.net.ips {
		s := &server{t: t, kind: kind + "-member", dir: t.TempDir(), ns: c.net.ns[i]}
		switch kind {
		case "etcd":
			c.etcdMember(s, i)
		case "zookeeper":
			c.zkMember(s, i)
		default:
			t.Fatalf("no %s cluster", kind)
		}
		c.members = append(c.members, s)
		t.Cleanup(func() { s.stop(syscall.SIGKILL) })
	}
	start := time.Now()
	for _, m := range c.members {
		m.launch()
	}
	for _, m := range c.members {
		m.awaitReady()
	}
	t.Logf("private %s cluster on %v ready in %v", kind, c.addrs(), time.Since(start).Round(time.Millisecond))
	return c
}

// etcd's default timing (100 ms heartbeats, 1 s election timeout): what
// a user gets without tuning.
func (c *cluster) etcdMember(s *server, i int) {
	var peers []string
	for j, ip := range c.net.ips {
		peers = append(peers, fmt.Sprintf("m%d=http://%s:2380", j, ip))
	}
	ip := c.net.ips[i]
	s.addr = ip + ":2379"
	s.args = []string{"etcd", "--name", fmt.Sprintf("m%d", i), "--data-dir", filepath.Join(s.dir, "data"),
		"--listen-client-urls", "http://" + s.addr, "--advertise-client-urls", "http://" + s.addr,
		"--listen-peer-urls", "http://" + ip + ":2380", "--initial-advertise-peer-urls", "http://" + ip + ":2380",
		"--initial-cluster", strings.Join(peers, ","), "--initial-cluster-state", "new",
		"--initial-cluster-token", c.net.bridge}
	s.ready = func(ctx context.Context) error {
		_, err := c.etcdStatus(ctx, s.addr)
		return err
	}
}

// ZooKeeper with a 500 ms tick: a follower that hears nothing from its
// leader for syncLimit ticks (2.5 s) gives up on it, and so does a leader
// on a follower.
func (c *cluster) zkMember(s *server, i int) {
	data := filepath.Join(s.dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		s.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(data, "myid"), []byte(fmt.Sprint(i+1)), 0o644); err != nil {
		s.t.Fatal(err)
	}
	ip := c.net.ips[i]
	s.addr = ip + ":2181"
	cfg := fmt.Sprintf("tickTime=500\ninitLimit=20\nsyncLimit=5\ndataDir=%s\nclientPort=2181\nclientPortAddress=%s\n"+
		"minSessionTimeout=1000\nmaxSessionTimeout=60000\nmaxClientCnxns=0\nadmin.enableServer=false\n"+
		"4lw.commands.whitelist=*\n", data, ip)
	for j, peer := range c.net.ips {
		cfg += fmt.Sprintf("server.%d=%s:2888:3888\n", j+1, peer)
	}
	if err := os.WriteFile(filepath.Join(s.dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		s.t.Fatal(err)
	}
	cp := s.dir + ":/usr/share/java/zookeeper.jar"
	for _, jar := range []string{"/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar"} {
		if _, err := os.Stat(jar); err == nil {
			cp += ":" + jar
		}
	}
	s.args = []string{"java", "-Xms32m", "-Xmx128m", "-Dzookeeper.log.dir=" + s.dir, "-cp", cp,
		"org.apache.zookeeper.server.quorum.QuorumPeerMain", filepath.Join(s.dir, "zoo.cfg")}
	s.ready = func(ctx context.Context) error {
		mode, err := zkMode(ctx, s.addr)
		if err == nil && mode != "leader" && mode != "follower" {
			err = fmt.Errorf("zookeeper member mode %q", mode)
		}
		return err
	}
}

// use makes t the test that a member's failure fails, for the fault about
// to run.
func (c *cluster) use(t *testing.T) {
	c.net.t = t
	for _, m := range c.members {
		m.t = t
	}
}

func (c *cluster) addrs(members ...int) []string {
	if len(members) == 0 {
		members = []int{0, 1, 2}
	}
	var out []string
	for _, i := range members {
		out = append(out, c.members[i].addr)
	}
	return out
}

// others are the members but i.
func others(i int) []int {
	var out []int
	for j := range 3 {
		if j != i {
			out = append(out, j)
		}
	}
	return out
}

// leader returns the index of the member that leads, as the running
// members see it, waiting up to 60 s for one to be elected.
func (c *cluster) leader(t *testing.T) int {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if i, ok := c.findLeader(); ok {
			return i
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s leader within 60s", c.kind)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (c *cluster) findLeader() (int, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	for i, m := range c.members {
		if m.cmd == nil {
			continue
		}
		switch c.kind {
		case "etcd":
			if st, err := c.etcdStatus(ctx, m.addr); err == nil && st.Leader == st.Header.MemberId {
				return i, true
			}
		case "zookeeper":
			if mode, err := zkMode(ctx, m.addr); err == nil && mode == "leader" {
				return i, true
			}
		}
	}
	return 0, false
}

// healthy waits until every member answers as part of a quorum again.
func (c *cluster) healthy() {
	for _, m := range c.members {
		m.awaitReady()
	}
}

// etcdStatus asks the member at addr alone for its status; an error also
// when it knows no leader.
func (c *cluster) etcdStatus(ctx context.Context, addr string) (*clientv3.StatusResponse, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, addr)
	if err == nil && st.Leader == 0 {
		err = fmt.Errorf("etcd member %s knows no leader", addr)
	}
	return st, err
}

// zkMode is the member's Mode line from the srvr command: leader,
// follower, or an error while it has no quorum ("This ZooKeeper instance
// is not currently serving requests").
func zkMode(ctx context.Context, addr string) (string, error) {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	if _, err := conn.Write([]byte("srvr")); err != nil {
		return "", err
	}
	sc := bufio.NewScanner(conn)
	var first string
	for sc.Scan() {
		line := sc.Text()
		if first == "" {
			first = line
		}
		if mode, ok := strings.CutPrefix(line, "Mode: "); ok {
			return mode, nil
		}
	}
	return "", fmt.Errorf("zookeeper %s: no mode in its srvr answer %q", addr, first)
}

// connections counts the client connections a ZooKeeper member holds,
// the one asking included.
func zkConnections(ctx context.Context, addr string) (int, error) {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	_ = conn.SetDeadline(dl)
	if _, err := conn.Write([]byte("cons")); err != nil {
		return 0, err
	}
	n := 0
	sc := bufio.NewScanner(conn)
	for sc.Scan() {
		if strings.Contains(sc.Text(), "(queued=") {
			n++
		}
	}
	return n, sc.Err()
}
