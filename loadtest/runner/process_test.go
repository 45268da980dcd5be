package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// exitSignal is the signal that ended the child, or -1 if none did.
func exitSignal(t *testing.T, c *child) syscall.Signal {
	t.Helper()
	<-c.done
	var exit *exec.ExitError
	if !errors.As(c.err, &exit) {
		return -1
	}
	ws, ok := exit.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() {
		return -1
	}
	return ws.Signal()
}

func TestAStartedProgramWritesToItsLogAndIsReapedWhenItExits(t *testing.T) {
	p, _ := fakeShopProgram(t, "RUNNER_FAKE_SERVE=exit")
	c, err := p.start(os.O_TRUNC)
	if err != nil {
		t.Fatal(err)
	}
	<-c.done
	var exit *exec.ExitError
	if !errors.As(c.err, &exit) || exit.ExitCode() != 3 {
		t.Errorf("exit error %v, want exit status 3", c.err)
	}
	if log := logOf(t, p.logPath); !strings.Contains(log, "cannot start") {
		t.Errorf("log %q lacks the program's output", log)
	}
	if alive(c.pid()) {
		t.Errorf("pid %d still exists after it exited", c.pid())
	}
}

func TestARestartAppendsToTheLogAndAFirstStartTruncatesIt(t *testing.T) {
	p, _ := fakeShopProgram(t, "RUNNER_FAKE_SERVE=exit")
	if err := os.WriteFile(p.logPath, []byte("an earlier run's log\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, flag := range []int{os.O_TRUNC, os.O_APPEND} {
		c, err := p.start(flag)
		if err != nil {
			t.Fatal(err)
		}
		<-c.done
	}
	log := logOf(t, p.logPath)
	if strings.Contains(log, "an earlier run's log") || strings.Count(log, "cannot start") != 2 {
		t.Errorf("log after a start and a restart:\n%s\nwant this run's two starts only", log)
	}
}

func TestAProgramThatCannotStartIsAnError(t *testing.T) {
	p, _ := fakeShopProgram(t)
	p.argv[0] = p.logPath + ".missing"
	if c, err := p.start(os.O_TRUNC); err == nil {
		c.kill()
		t.Fatal("a binary that does not exist started")
	}
}

// Stop gives a process its SIGTERM and the time to drain: it exits by
// itself, and is not killed.
func TestStopLetsAProcessDrainOnSIGTERM(t *testing.T) {
	p, port := fakeShopProgram(t)
	in := startFake(t, p, port)
	if err := in.waitReady(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
	in.stop(time.Minute)
	if in.err != nil {
		t.Errorf("exit error %v, want a clean exit after draining", in.err)
	}
	if log := logOf(t, p.logPath); !strings.Contains(log, "drained after SIGTERM") {
		t.Errorf("log %q: the process never saw its SIGTERM", log)
	}
}

// A process that does not stop on SIGTERM is killed once its grace is
// over, so that stopping a row never hangs on one instance.
func TestStopKillsAProcessThatIgnoresSIGTERMAfterItsGrace(t *testing.T) {
	p, port := fakeShopProgram(t, "RUNNER_FAKE_TERM=ignore")
	in := startFake(t, p, port)
	if err := in.waitReady(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
	in.stop(200 * time.Millisecond)
	if sig := exitSignal(t, in.child); sig != syscall.SIGKILL {
		t.Errorf("ended by signal %v, want SIGKILL", sig)
	}
	if alive(in.pid()) {
		t.Errorf("pid %d still exists after stop", in.pid())
	}
}

func TestKillEndsTheProcessAtOnceAndWaitsForIt(t *testing.T) {
	p, port := fakeShopProgram(t, "RUNNER_FAKE_TERM=ignore")
	in := startFake(t, p, port)
	in.kill()
	select {
	case <-in.done:
	default:
		t.Fatal("kill returned before the process was gone")
	}
	if sig := exitSignal(t, in.child); sig != syscall.SIGKILL {
		t.Errorf("ended by signal %v, want SIGKILL", sig)
	}
	if alive(in.pid()) {
		t.Errorf("pid %d still exists after kill", in.pid())
	}
}

// The events faults stop a consumer with SIGSTOP and let it go on: the
// signal reaches the process, and one that has exited ignores it.
func TestSignalReachesTheProcessAndAnExitedOneIgnoresIt(t *testing.T) {
	p, port := fakeShopProgram(t)
	in := startFake(t, p, port)
	if err := in.waitReady(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
	in.signal(syscall.SIGTERM)
	<-in.done
	if log := logOf(t, p.logPath); !strings.Contains(log, "drained after SIGTERM") {
		t.Errorf("log %q: the signal did not arrive", log)
	}
	in.signal(syscall.SIGTERM) // must not panic or block
	in.stop(time.Second)       // nor must stopping it again
}
