package faults

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/testenv"
)

// clockRedis is a private Redis without persistence whose wall clock the
// test can move: redis-server runs with testdata/clockshift.c preloaded,
// which adds the offset in shiftFile to every reading of the wall clock.
// Redis expires keys by that clock, so moving it forward by more than a
// key's TTL expires the key, as an NTP step on that host would.
type clockRedis struct {
	*server
	shiftFile string
}

// newClockRedis starts a Redis with lib (clockShiftLib) preloaded.
func newClockRedis(t *testing.T, lib string) *clockRedis {
	t.Helper()
	port := freePort(t)
	s := &server{t: t, kind: "redis", dir: t.TempDir(), addr: fmt.Sprintf("127.0.0.1:%d", port)}
	prepareVolatileRedis(t, s, "127.0.0.1", port)
	c := &clockRedis{server: s, shiftFile: filepath.Join(s.dir, "clockshift")}
	c.jump(0)
	s.args = append([]string{"env", "LD_PRELOAD=" + lib, "CLOCKSHIFT_FILE=" + c.shiftFile}, s.args...)
	s.start()
	t.Cleanup(func() { s.stop(syscall.SIGKILL) })
	return c
}

// clockShiftLib builds testdata/clockshift.c into a shared library in a
// directory of t's. The C compiler is the one cgo and -race already need;
// without it the test is skipped, and fails in CI.
func clockShiftLib(t *testing.T) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "cc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		testenv.Missing(t, "a C compiler (%s) to build testdata/clockshift.c: %v", cc, err)
	}
	lib := filepath.Join(t.TempDir(), "clockshift.so")
	out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-o", lib, "testdata/clockshift.c").CombinedOutput()
	if err != nil {
		t.Fatalf("build clockshift.so: %v\n%s", err, out)
	}
	return lib
}

// jump sets the server's wall clock to the real time plus d, at once.
func (c *clockRedis) jump(d time.Duration) {
	c.t.Helper()
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(d.Nanoseconds()))
	// Written in place, never replaced: the server maps this file.
	f, err := os.OpenFile(c.shiftFile, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt(b[:], 0); err != nil {
		c.t.Fatal(err)
	}
}

// restartEmpty kills the server and starts it again on the same port:
// without persistence it comes back with no keys.
func (c *clockRedis) restartEmpty() {
	c.stop(syscall.SIGKILL)
	c.start()
}

// gate forwards TCP to a server until it is cut; while cut it closes every
// connection through it and every new one at once, so no request reaches
// the server, which runs on. A SIGSTOPped server would not do: the request
// a client gave up on waits in the server's socket and is applied when the
// server is continued, a grant the client never counted.
type gate struct {
	ln     net.Listener
	target string

	mu    sync.Mutex
	cut   bool
	conns []net.Conn
	wg    sync.WaitGroup
}

func newGate(t *testing.T, target string) *gate {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := &gate{ln: ln, target: target}
	g.wg.Add(1)
	go g.accept()
	t.Cleanup(func() {
		ln.Close()
		g.close()
		g.wg.Wait()
	})
	return g
}

func (g *gate) addr() string { return g.ln.Addr().String() }

func (g *gate) accept() {
	defer g.wg.Done()
	for {
		in, err := g.ln.Accept()
		if err != nil {
			return
		}
		if !g.forward(in) {
			in.Close()
		}
	}
}

// forward connects in to the target unless the gate is cut.
func (g *gate) forward(in net.Conn) bool {
	if g.isCut() {
		return false
	}
	out, err := net.DialTimeout("tcp", g.target, 5*time.Second)
	if err != nil {
		return false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.cut { // cut while dialling
		out.Close()
		return false
	}
	g.conns = append(g.conns, in, out)
	g.wg.Add(2)
	go func() { defer g.wg.Done(); _, _ = io.Copy(out, in); out.Close() }()
	go func() { defer g.wg.Done(); _, _ = io.Copy(in, out); in.Close() }()
	return true
}

func (g *gate) isCut() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.cut
}

// setCut cuts the gate (closing every connection through it) or heals it.
func (g *gate) setCut(cut bool) {
	g.mu.Lock()
	g.cut = cut
	g.mu.Unlock()
	if cut {
		g.close()
	}
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		c.Close()
	}
	g.conns = nil
}
