package main

import (
	"context"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// An instance that answers /readyz 503 while it starts is waited for, and
// not given up on at its first answer.
func TestWaitReadyWaitsThroughNotReadyAnswers(t *testing.T) {
	p, port := fakeShopProgram(t, "RUNNER_FAKE_NOT_READY=3")
	in := startFake(t, p, port)
	if err := in.waitReady(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
	log := logOf(t, p.logPath)
	if n := strings.Count(log, "readyz 503"); n != 3 || !strings.HasSuffix(log, "readyz 200\n") {
		t.Errorf("log:\n%s\nwant three 503 answers, then ready", log)
	}
	if in.url != "http://127.0.0.1:"+strconv.Itoa(port) {
		t.Errorf("url %s, want the port it was started on, %d", in.url, port)
	}
}

func TestWaitReadyReportsAnInstanceThatExitsWithItsLog(t *testing.T) {
	p, port := fakeShopProgram(t, "RUNNER_FAKE_SERVE=exit")
	in := startFake(t, p, port)
	err := in.waitReady(context.Background(), time.Minute)
	if err == nil || !strings.Contains(err.Error(), "exited before it was ready (exit status 3)") ||
		!strings.Contains(err.Error(), p.logPath) {
		t.Errorf("error %v, want the exit and the log to read", err)
	}
}

func TestWaitReadyGivesUpOnAnInstanceNeverReady(t *testing.T) {
	p, port := fakeShopProgram(t, "RUNNER_FAKE_NOT_READY=-1")
	in := startFake(t, p, port)
	err := in.waitReady(context.Background(), 300*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "not ready after 300ms") || !strings.Contains(err.Error(), p.logPath) {
		t.Errorf("error %v, want not ready, with the log to read", err)
	}
	select {
	case <-in.done:
		t.Error("waitReady stopped the instance; stopping it is the row's cleanup")
	default:
	}
}

func TestWaitReadyEndsWithItsContext(t *testing.T) {
	p, port := fakeShopProgram(t, "RUNNER_FAKE_NOT_READY=-1")
	in := startFake(t, p, port)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := in.waitReady(ctx, time.Hour); err == nil {
		t.Error("an interrupted wait reported the instance ready")
	}
}

// A restart is a crash and a new start: the old process is SIGKILLed,
// the new one listens on the same port and its log goes on after the
// old one's.
func TestRestartKillsTheInstanceAndStartsItAgainOnItsPort(t *testing.T) {
	p, port := fakeShopProgram(t)
	in := startFake(t, p, port)
	if err := in.waitReady(context.Background(), time.Minute); err != nil {
		t.Fatal(err)
	}
	again, err := in.restart(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(again.kill)
	if sig := exitSignal(t, in.child); sig != syscall.SIGKILL {
		t.Errorf("the old process ended by signal %v, want SIGKILL", sig)
	}
	if again.pid() == in.pid() || alive(in.pid()) || !alive(again.pid()) {
		t.Errorf("old pid %d (alive %v), new pid %d (alive %v)", in.pid(), alive(in.pid()), again.pid(), alive(again.pid()))
	}
	if again.url != in.url {
		t.Errorf("restarted at %s, was at %s", again.url, in.url)
	}
	if log := logOf(t, p.logPath); strings.Count(log, "serve listening as") != 2 {
		t.Errorf("log:\n%s\nwant both starts in it", log)
	}
	again.stop(time.Minute)
	if again.err != nil {
		t.Errorf("the restarted instance did not drain: %v", again.err)
	}
}

// A restart that cannot start the process again returns the dead one, so
// that the row's cleanup still has something to stop.
func TestRestartThatFailsKeepsTheDeadInstance(t *testing.T) {
	p, port := fakeShopProgram(t)
	in := startFake(t, p, port)
	in.prog.argv = []string{p.logPath + ".missing"}
	got, err := in.restart(context.Background())
	if err == nil || got != in {
		t.Fatalf("restart of a missing binary: %v, %v", got, err)
	}
	got.stop(time.Second) // returns: the process is already gone
}

func TestStopAllStopsEveryInstance(t *testing.T) {
	var all []*instance
	for range 3 {
		p, port := fakeShopProgram(t)
		all = append(all, startFake(t, p, port))
	}
	for _, in := range all {
		if err := in.waitReady(context.Background(), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	stopAll(all)
	for i, in := range all {
		select {
		case <-in.done:
		default:
			t.Errorf("instance %d still running after stopAll", i+1)
		}
		if in.err != nil {
			t.Errorf("instance %d: %v, want a drained exit", i+1, in.err)
		}
	}
}
