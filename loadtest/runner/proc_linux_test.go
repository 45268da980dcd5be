package main

import (
	"net"
	"os"
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
