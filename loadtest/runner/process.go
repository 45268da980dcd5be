package main

import (
	"os"
	"os/exec"
	"syscall"
	"time"
)

// program is how to start one process the runner keeps running (a shop
// instance, an events row's broker), kept so that the runner can start it
// again after killing it.
type program struct {
	argv    []string
	env     []string // nil: the runner's own
	logPath string   // stdout and stderr
}

// child is a started program.
type child struct {
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	err     error         // its exit error, valid after done
}

// start runs p; logFlag is os.O_TRUNC the first time, os.O_APPEND after a
// restart.
func (p program) start(logFlag int) (*child, error) {
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|logFlag, 0o644)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(p.argv[0], p.argv[1:]...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, err
	}
	c := &child{cmd: cmd, logPath: p.logPath, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		f.Close()
		close(c.done)
	}()
	return c, nil
}

func (c *child) pid() int { return c.cmd.Process.Pid }

// signal sends sig; one that exited already gets nothing.
func (c *child) signal(sig os.Signal) { _ = c.cmd.Process.Signal(sig) }

// kill SIGKILLs the process, as a crash would, and waits until it is gone.
func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	<-c.done
}

// stop sends SIGTERM, lets the process drain, and kills it if it is still
// there after grace.
func (c *child) stop(grace time.Duration) {
	c.signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		c.kill()
	}
}
