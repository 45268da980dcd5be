package main

import (
	"bufio"
	"bytes"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The CPU of a step is read from /proc for the instances and getrusage for
// the runner: both must see this process's own work.
func TestProcessCPUAndSelfCPUSeeWorkDone(t *testing.T) {
	before, self := processCPU(os.Getpid()), selfCPU()
	for sum, start := 0, time.Now(); time.Since(start) < 300*time.Millisecond; sum++ {
		_ = sum
	}
	if got := processCPU(os.Getpid()) - before; got <= 0 {
		t.Errorf("processCPU rose by %v over a busy loop", got)
	}
	if got := selfCPU() - self; got <= 0 {
		t.Errorf("selfCPU rose by %v over a busy loop", got)
	}
	if got := processCPU(-1); got != 0 {
		t.Errorf("processCPU of no process = %v, want 0", got)
	}
}

// The runner finds which of its children holds the client side of a
// connection, by its local port, as the database lists it.
func TestOwnsLocalPortFindsThisProcessSocket(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	port := c.LocalAddr().(*net.TCPAddr).Port
	if !ownsLocalPort(os.Getpid(), port) {
		t.Errorf("this process's port %d is not found as its own", port)
	}
	if ownsLocalPort(os.Getppid(), port) {
		t.Errorf("the parent process is said to own this process's port %d", port)
	}
}

// running reports whether pid is a process that has not exited: a zombie
// has, even while nobody reaps it.
func running(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// No instance outlives its runner: when the runner is killed without
// stopping its children (kill -9, a crash), the kernel sends them SIGTERM
// and they drain and exit.
func TestTheKernelStopsTheInstancesOfARunnerThatDies(t *testing.T) {
	childLog := filepath.Join(t.TempDir(), "child.log")
	parent := exec.Command(os.Args[0])
	parent.Env = append(os.Environ(), "RUNNER_FAKE=parent", "RUNNER_FAKE_CHILD_LOG="+childLog)
	out, err := parent.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := parent.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	pid, convErr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || convErr != nil {
		_ = parent.Process.Kill()
		_ = parent.Wait()
		t.Fatalf("the fake runner printed %q (%v)", line, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) })
	if !running(pid) {
		t.Fatalf("the fake runner's instance %d is not running while the runner lives", pid)
	}
	_ = parent.Process.Kill()
	_ = parent.Wait()
	deadline := time.Now().Add(time.Minute) // a bound for a loaded machine, not a measurement
	for running(pid) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if running(pid) {
		t.Fatalf("instance %d still runs a minute after its runner was killed", pid)
	}
	if log := logOf(t, childLog); !strings.Contains(log, "drained after SIGTERM") {
		t.Errorf("instance log %q: it was not stopped by SIGTERM", log)
	}
}
