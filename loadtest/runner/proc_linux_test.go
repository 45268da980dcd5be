package main

import (
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
