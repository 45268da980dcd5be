package zklock

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/adler32"
	"math"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockbench/shop/internal/lockkit"
)

// When a key directory's child counter wraps (after 2^31 creates, the
// sequence numbers turn negative), the first node after the wrap must not
// think itself first while the node before the wrap holds the key.
//
// Two billion creates would take days, so the test starts a private
// ZooKeeper whose snapshot says the directory has already counted to
// 2^31-1: the counter the server itself keeps, one create from the wrap.
func TestSequenceWrapKeepsOneHolder(t *testing.T) {
	serverAddrs(t) // the shared server's presence says this machine has ZooKeeper
	zs := startPrivateZK(t)
	key := "zklock:test:wrap"
	dir := (&Locker{root: testRoot}).dir(key)
	zs.withDir(dir, math.MaxInt32)

	a, b := open(t, []string{zs.addr}), open(t, []string{zs.addr})
	ctx := context.Background()
	la := try(t, a, key)
	defer la.Release(ctx)
	lb, err := b.TryAcquire(ctx, key)
	if err == nil {
		nodes := queue(t, a, key)
		lb.Release(ctx)
		t.Fatalf("two holders of one key after the sequence wrapped (queue %v)", nodes)
	}
	if !errors.Is(err, lockkit.ErrNotAcquired) {
		t.Fatalf("second TryAcquire = %v, want ErrNotAcquired", err)
	}

	// The key still hands over in order: a waiter gets it once a releases.
	got := make(chan error, 1)
	go func() {
		lease, err := b.Acquire(ctx, key)
		if err == nil {
			err = lease.Release(ctx)
		}
		got <- err
	}()
	time.Sleep(100 * time.Millisecond)
	select {
	case err := <-got:
		t.Fatalf("waiter returned %v while a held the key", err)
	default:
	}
	if err := la.Release(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * sessionTimeout):
		t.Fatal("waiter not granted after the holder released")
	}
}

// privateZK is a ZooKeeper of this test's own, on a free loopback port,
// whose data the test may rewrite between runs.
type privateZK struct {
	t    *testing.T
	addr string
	dir  string
	cmd  *exec.Cmd
}

func startPrivateZK(t *testing.T) *privateZK {
	t.Helper()
	const jar = "/usr/share/java/zookeeper.jar"
	if _, err := os.Stat(jar); err != nil {
		t.Fatalf("the shared ZooKeeper runs but %s is missing: %v", jar, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	zs := &privateZK{t: t, addr: fmt.Sprintf("127.0.0.1:%d", port), dir: t.TempDir()}
	cfg := fmt.Sprintf("tickTime=500\ndataDir=%s\nclientPort=%d\nclientPortAddress=127.0.0.1\n"+
		"minSessionTimeout=1000\nmaxSessionTimeout=60000\nadmin.enableServer=false\n4lw.commands.whitelist=ruok\n",
		filepath.Join(zs.dir, "data"), port)
	if err := os.WriteFile(filepath.Join(zs.dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	zs.start()
	t.Cleanup(zs.stop)
	return zs
}

func (zs *privateZK) start() {
	zs.t.Helper()
	cp := "/usr/share/java/zookeeper.jar"
	for _, jar := range []string{"/usr/share/java/slf4j-log4j12.jar", "/usr/share/java/log4j-1.2.jar"} {
		if _, err := os.Stat(jar); err == nil {
			cp += ":" + jar
		}
	}
	log, err := os.OpenFile(filepath.Join(zs.dir, "server.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		zs.t.Fatal(err)
	}
	defer log.Close()
	zs.cmd = exec.Command("java", "-Xms32m", "-Xmx128m", "-cp", cp,
		"org.apache.zookeeper.server.quorum.QuorumPeerMain", filepath.Join(zs.dir, "zoo.cfg"))
	zs.cmd.Stdout, zs.cmd.Stderr = log, log
	zs.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := zs.cmd.Start(); err != nil {
		zs.t.Fatal(err)
	}
	// Serving, not only listening: a session and a read.
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		conn, _, err := zk.Connect([]string{zs.addr}, sessionTimeout, zk.WithLogInfo(false), zk.WithLogger(quiet{}))
		if err == nil {
			_, _, err = conn.Exists("/")
			conn.Close()
			if err == nil {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	out, _ := os.ReadFile(filepath.Join(zs.dir, "server.log"))
	zs.t.Fatalf("private ZooKeeper not ready in 60 s:\n%s", out)
}

func (zs *privateZK) stop() {
	if zs.cmd == nil {
		return
	}
	_ = syscall.Kill(-zs.cmd.Process.Pid, syscall.SIGKILL)
	_ = zs.cmd.Wait()
	zs.cmd = nil
}

// withDir creates dir and sets its child counter to next: the number of
// children ever created, stored as the node's cversion, which the server
// appends to the next sequential child's name. ZooKeeper offers no call for that, so it goes
// through the server's own files: the server writes a snapshot of the
// tree, with dir in it, when it starts; the test rewrites dir's cversion
// in that snapshot, fixes its checksums and starts the server on it.
func (zs *privateZK) withDir(dir string, next int32) {
	t := zs.t
	t.Helper()
	conn := dialZK(t, []string{zs.addr})
	for i := 1; i <= len(dir); i++ {
		if i == len(dir) || dir[i] == '/' {
			if _, err := conn.Create(dir[:i], nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				t.Fatal(err)
			}
		}
	}
	conn.Close()
	zs.stop()
	zs.start() // loading the log, the server snapshots a tree with dir in it
	zs.stop()
	snap := newestSnapshot(t, filepath.Join(zs.dir, "data", "version-2"))
	data, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	if err := setCversion(data, dir, next); err != nil {
		t.Fatalf("%s: %v", snap, err)
	}
	if err := os.WriteFile(snap, data, 0o644); err != nil {
		t.Fatal(err)
	}
	zs.start()
	conn = dialZK(t, []string{zs.addr})
	defer conn.Close()
	// A Stat's cversion counts creates and deletes: twice the stored
	// count of creates, less the children still there.
	_, stat, err := conn.Exists(dir)
	if err != nil || stat.Cversion != int32(2*uint32(next)) {
		t.Fatalf("after the rewrite %s has cversion %v (%v), want %d", dir, stat.Cversion, err, int32(2*uint32(next)))
	}
}

func newestSnapshot(t *testing.T, dir string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "snapshot.*"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no snapshot in %s (%v)", dir, err)
	}
	newest, best := "", int64(-1)
	for _, f := range files {
		var zxid int64
		if _, err := fmt.Sscanf(strings.TrimPrefix(filepath.Base(f), "snapshot."), "%x", &zxid); err == nil && zxid > best {
			newest, best = f, zxid
		}
	}
	return newest
}

// setCversion rewrites, in a snapshot as ZooKeeper 3.5-3.9 write it (jute:
// big-endian, strings and buffers length-prefixed), the cversion of node
// path, then the Adler-32 seals. A node is its path, its data, an ACL
// reference (int64) and StatPersisted: czxid, mzxid, ctime, mtime (int64
// each), version, cversion (int32). Each seal is the running checksum of
// everything before it followed by the path "/".
func setCversion(snap []byte, node string, cversion int32) error {
	rec := binary.BigEndian.AppendUint32(nil, uint32(len(node)))
	rec = append(rec, node...)
	at := bytes.Index(snap, rec)
	if at < 0 {
		return fmt.Errorf("node %s not found", node)
	}
	p := at + len(rec)
	dataLen := int32(binary.BigEndian.Uint32(snap[p:]))
	p += 4
	if dataLen > 0 {
		p += int(dataLen)
	}
	p += 8 + 4*8 + 4 // acl, czxid, mzxid, ctime, mtime, version
	// Find the seals before touching anything: each is where the running
	// checksum appears, followed by the string "/".
	var seals []int
	sum := adler32.New()
	for i := 0; i+13 <= len(snap); i++ {
		if binary.BigEndian.Uint64(snap[i:]) == uint64(sum.Sum32()) && bytes.Equal(snap[i+8:i+13], []byte{0, 0, 0, 1, '/'}) && i > p {
			seals = append(seals, i)
			sum.Write(snap[i : i+13])
			i += 12
			continue
		}
		sum.Write(snap[i : i+1])
	}
	if len(seals) == 0 {
		return errors.New("no checksum seal found")
	}
	binary.BigEndian.PutUint32(snap[p:], uint32(cversion))
	sum.Reset()
	from := 0
	for _, s := range seals {
		sum.Write(snap[from:s])
		binary.BigEndian.PutUint64(snap[s:], uint64(sum.Sum32()))
		sum.Write(snap[s : s+13])
		from = s + 13
	}
	return nil
}

// quiet drops the client's complaints while the server starts.
type quiet struct{}

func (quiet) Printf(string, ...any) {}
