package testenv

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// The variables scripts/testenv.sh sets for NATS.
const (
	NATSURLVar         = "SHOP_TEST_NATS_URL"          // one JetStream server
	NATSClusterURLsVar = "SHOP_TEST_NATS_CLUSTER_URLS" // the 3 nodes of a JetStream cluster, comma-separated
	NATSServerVar      = "SHOP_TEST_NATS_SERVER"       // the nats-server binary go.mod's version builds
)

// NATSProcess is a nats-server of the test's own (JetStream, file store in
// a directory that outlives Stop), for tests that take the broker away and
// bring it back: Stop and Start keep its port and its stored streams.
type NATSProcess struct {
	t    testing.TB
	bin  string
	conf string
	port int
	cmd  *exec.Cmd
	done chan struct{}
}

// StartNATS starts a private nats-server on a free loopback port, stopped
// at the end of the test. It needs SHOP_TEST_NATS_SERVER (skipped without
// it, failed in CI).
func StartNATS(t testing.TB) *NATSProcess {
	t.Helper()
	bin := Require(t, NATSServerVar)
	dir := t.TempDir()
	port := freePort(t)
	conf := filepath.Join(dir, "nats.conf")
	body := fmt.Sprintf("listen: 127.0.0.1:%d\njetstream { store_dir: %q }\n", port, filepath.Join(dir, "js"))
	if err := os.WriteFile(conf, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	p := &NATSProcess{t: t, bin: bin, conf: conf, port: port}
	p.Start()
	t.Cleanup(p.Stop)
	return p
}

// ServiceBroker is the SHOP_NATS_URL for a shop under test: a private
// nats-server process (StartNATS) when SHOP_TEST_NATS_SERVER is set, as
// it must be in CI, and otherwise "", the service's embedded broker, so
// that such a test needs nothing but Go. Out of process, the broker's own
// data races (nats-server's JetStream has had several under the race
// detector, e.g. nats-io/nats-server#7288) are not reported as shop's.
func ServiceBroker(t testing.TB) string {
	t.Helper()
	if os.Getenv(NATSServerVar) == "" && os.Getenv("CI") != "true" {
		return ""
	}
	return StartNATS(t).URL()
}

// URL is the address clients connect to; it stays the same across restarts.
func (p *NATSProcess) URL() string { return fmt.Sprintf("nats://127.0.0.1:%d", p.port) }

// Start starts the server again after Stop and waits until it accepts
// connections; it does nothing while the server runs.
func (p *NATSProcess) Start() {
	p.t.Helper()
	if p.cmd != nil {
		return
	}
	cmd := exec.Command(p.bin, "-c", p.conf)
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start nats-server: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	p.cmd, p.done = cmd, done
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p.port), time.Second)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("nats-server on port %d not accepting after 30s: %v", p.port, err)
		}
		select {
		case <-done:
			p.t.Fatalf("nats-server on port %d exited at start", p.port)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Stop kills the server (SIGKILL: the broker vanishes as in a crash) and
// waits until it has exited.
func (p *NATSProcess) Stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	p.cmd = nil
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// NATSClusterURLs returns the nodes of the test JetStream cluster.
func NATSClusterURLs(t testing.TB) []string {
	t.Helper()
	return strings.Split(Require(t, NATSClusterURLsVar), ",")
}
