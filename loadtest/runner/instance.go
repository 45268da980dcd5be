package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

// instance is one running shop process (serve, or an events row's
// consume) answering on url.
type instance struct {
	*child
	url  string
	port int
	prog program
}

// startInstance starts p, a shop process that listens on port; logFlag as
// for program.start.
func (p program) startInstance(port, logFlag int) (*instance, error) {
	c, err := p.start(logFlag)
	if err != nil {
		return nil, err
	}
	return &instance{child: c, url: "http://127.0.0.1:" + strconv.Itoa(port), port: port, prog: p}, nil
}

// restart SIGKILLs the process, as a crash would, starts it again with the
// same settings and waits until it is ready.
func (in *instance) restart(ctx context.Context) (*instance, error) {
	in.kill()
	again, err := in.prog.startInstance(in.port, os.O_APPEND)
	if err != nil {
		return in, err // dead, as it was killed; stop still works
	}
	return again, again.waitReady(ctx, 60*time.Second)
}

// waitReady polls /readyz until it answers 200, the process exits, or
// the deadline passes.
func (in *instance) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, in.url+"/readyz", nil)
		if res, err := http.DefaultClient.Do(req); err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-in.done:
			return fmt.Errorf("%s exited before it was ready (%v); see %s", in.url, in.err, in.logPath)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s; see %s", in.url, timeout, in.logPath)
		case <-tick.C:
		}
	}
}

// stopAll stops the instances at once, each given shop's drain
// (SHOP_SHUTDOWN_TIMEOUT=5s) and then some before it is killed.
func stopAll(instances []*instance) {
	var wg sync.WaitGroup
	for _, in := range instances {
		wg.Go(func() { in.stop(10 * time.Second) })
	}
	wg.Wait()
}

// freePort asks the kernel for a free loopback port. Another process may
// take it before shop binds it; start then fails clearly and the row is
// reported as not run.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
