package faults

import (
	"bufio"
	"context"
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
)

// server is one private lock server this package starts, on loopback
// ports nobody else uses, so that it can be stopped and restarted without
// disturbing the shared servers of other tests. It runs in its own process
// group and is killed when the test ends.
type server struct {
	t     testing.TB
	kind  string
	addr  string // what clients dial
	dir   string
	args  []string
	ready func(ctx context.Context) error
	// ns, if set, is the network namespace the server runs in.
	ns string

	cmd  *exec.Cmd
	done chan struct{}
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func (s *server) start() {
	s.t.Helper()
	s.launch()
	s.awaitReady()
}

// launch starts the server's process without waiting for it to be ready:
// the members of a cluster are ready only once a quorum of them runs.
func (s *server) launch() {
	s.t.Helper()
	args := s.args
	if s.ns != "" {
		args = append([]string{"ip", "netns", "exec", s.ns}, args...)
	}
	cmd := exec.Command(args[0], args[1:]...)
	log, err := os.OpenFile(filepath.Join(s.dir, "server.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		s.t.Fatal(err)
	}
	defer log.Close()
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start %s: %v", s.kind, err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	go func() { _ = cmd.Wait(); close(s.done) }()
}

// awaitReady polls ready for up to 90 s, failing the test if the server
// exits or stays unready.
func (s *server) awaitReady() {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	for {
		err := s.ready(ctx)
		if err == nil {
			return
		}
		select {
		case <-s.done:
			s.t.Fatalf("%s exited at start: %s", s.kind, s.logTail())
		case <-ctx.Done():
			s.t.Fatalf("%s not ready in 90s: %v\n%s", s.kind, err, s.logTail())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// stop sends sig to the server's process group and waits for it to exit,
// killing it after 30 s.
func (s *server) stop(sig syscall.Signal) {
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, sig)
	select {
	case <-s.done:
	case <-time.After(30 * time.Second):
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	}
	s.cmd = nil
}

func (s *server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "server.log"))
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > 30 {
		lines = lines[len(lines)-30:]
	}
	return strings.Join(lines, "\n")
}

// newServer prepares (kind's own setup included) and starts a private
// server of kind on host (127.0.0.1 unless a test names its own address).
func newServer(t *testing.T, kind, host string) *server {
	t.Helper()
	s := &server{t: t, kind: kind, dir: t.TempDir()}
	port := freePort(t)
	s.addr = net.JoinHostPort(host, fmt.Sprint(port))
	prepare, ok := serverKinds[kind]
	if !ok {
		t.Fatalf("no private %s server", kind)
	}
	prepare(t, s, host, port)
	start := time.Now()
	s.start()
	t.Logf("private %s on %s ready in %v", kind, s.addr, time.Since(start).Round(time.Millisecond))
	t.Cleanup(func() { s.stop(syscall.SIGKILL) })
	return s
}

// serverKinds set, per kind, a server's command line and readiness check
// (and do the kind's own setup) for a server on host:port.
var serverKinds = map[string]func(t *testing.T, s *server, host string, port int){
	"redis-volatile": prepareVolatileRedis,
	"redis":          prepareRedis,
	"memcached":      prepareMemcached,
	"etcd":           prepareEtcd,
	"zookeeper":      prepareZooKeeper,
	"mariadb":        prepareMariaDB,
}

func prepareVolatileRedis(_ *testing.T, s *server, host string, port int) {
	s.args = []string{"redis-server", "--port", fmt.Sprint(port), "--bind", host, "--save", "",
		"--appendonly", "no", "--dir", s.dir, "--protected-mode", "no"}
	s.ready = redisReady(s.addr)
}

// prepareRedis: appendfsync always: the restart keeps every grant and
// counter, the persistent case beside redis-volatile (docs/faults.md,
// fault 3).
func prepareRedis(_ *testing.T, s *server, host string, port int) {
	s.args = []string{"redis-server", "--port", fmt.Sprint(port), "--bind", host, "--save", "",
		"--appendonly", "yes", "--appendfsync", "always", "--dir", s.dir, "--protected-mode", "no",
		"--enable-debug-command", "yes"}
	s.ready = redisReady(s.addr)
}

func prepareMemcached(_ *testing.T, s *server, host string, port int) {
	s.args = []string{"memcached", "-l", host, "-p", fmt.Sprint(port), "-U", "0", "-m", "16", "-u", "root"}
	s.ready = func(ctx context.Context) error {
		reply, err := say(ctx, s.addr, "version\r\n")
		if err == nil && !strings.HasPrefix(reply, "VERSION") {
			err = fmt.Errorf("memcached answered %q", reply)
		}
		return err
	}
}

func prepareEtcd(t *testing.T, s *server, host string, _ int) {
	peer := net.JoinHostPort(host, fmt.Sprint(freePort(t)))
	s.args = []string{"etcd", "--name", "faults", "--data-dir", filepath.Join(s.dir, "data"),
		"--listen-client-urls", "http://" + s.addr, "--advertise-client-urls", "http://" + s.addr,
		"--listen-peer-urls", "http://" + peer, "--initial-advertise-peer-urls", "http://" + peer,
		"--initial-cluster", "faults=http://" + peer, "--initial-cluster-state", "new"}
	s.ready = func(ctx context.Context) error {
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+s.addr+"/health", nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		if res.StatusCode != http.StatusOK {
			return fmt.Errorf("etcd /health: %s", res.Status)
		}
		return nil
	}
}

func prepareZooKeeper(t *testing.T, s *server, host string, port int) {
	data := filepath.Join(s.dir, "data")
	if err := os.MkdirAll(data, 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf("tickTime=500\ndataDir=%s\nclientPort=%d\nclientPortAddress=%s\n"+
		"minSessionTimeout=1000\nmaxSessionTimeout=60000\nmaxClientCnxns=0\nadmin.enableServer=false\n"+
		"4lw.commands.whitelist=*\n", data, port, host)
	if err := os.WriteFile(filepath.Join(s.dir, "zoo.cfg"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
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
		reply, err := say(ctx, s.addr, "ruok")
		if err == nil && reply != "imok" {
			err = fmt.Errorf("zookeeper answered %q", reply)
		}
		return err
	}
}

func prepareMariaDB(t *testing.T, s *server, host string, port int) {
	data := filepath.Join(s.dir, "data")
	start := time.Now()
	// A tmpdir of its own: two servers set up at once in the shared
	// /tmp collided on a temporary table's name and one aborted
	// ("Error on delete of '/tmp/#sql-temptable-...MAI'"), 2 runs in 20.
	out, err := exec.Command("mariadb-install-db", "--no-defaults", "--datadir="+data, "--user=root",
		"--auth-root-authentication-method=normal", "--skip-test-db", "--tmpdir="+s.dir).CombinedOutput()
	if err != nil {
		t.Fatalf("mariadb-install-db: %v\n%s", err, out)
	}
	t.Logf("mariadb-install-db took %v", time.Since(start).Round(time.Millisecond))
	// --skip-grant-tables: a throwaway server on loopback, reached
	// by this test only; any user name is root.
	s.args = []string{"mariadbd", "--no-defaults", "--datadir=" + data, "--tmpdir=" + s.dir, "--socket=" + filepath.Join(s.dir, "sock"),
		"--port=" + fmt.Sprint(port), "--bind-address=" + host, "--user=root", "--skip-grant-tables",
		"--skip-log-bin", "--innodb-buffer-pool-size=32M", "--pid-file=" + filepath.Join(s.dir, "pid"),
		"--log-error=" + filepath.Join(s.dir, "server.log")}
	s.ready = func(ctx context.Context) error { return pingMySQL(ctx, s.dsn("")) }
}

// dsn is a go-sql-driver DSN for database db on a private MariaDB.
func (s *server) dsn(db string) string {
	cfg := mysql.NewConfig()
	cfg.User, cfg.Net, cfg.Addr, cfg.DBName = "root", "tcp", s.addr, db
	cfg.ParseTime, cfg.Timeout = true, 3*time.Second
	return cfg.FormatDSN()
}

func pingMySQL(ctx context.Context, dsn string) error {
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	return db.PingContext(ctx)
}

func redisReady(addr string) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		defer c.Close()
		return c.Ping(ctx).Err()
	}
}

// say sends text to addr and reads the reply until the server closes or
// the first line ends.
func say(ctx context.Context, addr, text string) (string, error) {
	var d net.Dialer
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return "", err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	if _, err := c.Write([]byte(text)); err != nil {
		return "", err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if line != "" {
		err = nil
	}
	return strings.TrimSpace(line), err
}

func sqlOpen(dsn string) (*sql.DB, error) { return sql.Open("mysql", dsn) }
