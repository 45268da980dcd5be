package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// broker is a nats-server of the row's own (JetStream, file store in a
// directory of its own), so that no event of another row, whose order ids
// start at 1 too, is taken for a duplicate of this row's by the stream's
// deduplication, and so that the runner can restart it.
type broker struct {
	prog program
	dir  string
	port int
	proc *child
}

// startBroker starts bin with its store in a new temporary directory,
// removed by stop.
func startBroker(ctx context.Context, bin, logPath string) (*broker, error) {
	if bin == "" {
		return nil, fmt.Errorf("SHOP_TEST_NATS_SERVER is unset: the events rows start a nats-server of their own (scripts/testenv.sh builds it)")
	}
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "shop-loadtest-nats-")
	if err != nil {
		return nil, err
	}
	argv := []string{bin, "-n", "shop-loadtest", "-a", "127.0.0.1", "-p", strconv.Itoa(port), "-js", "-sd", dir}
	b := &broker{prog: program{argv: argv, logPath: logPath}, dir: dir, port: port}
	if err := b.start(ctx, os.O_TRUNC); err != nil {
		b.stop()
		return nil, err
	}
	return b, nil
}

func (b *broker) url() string { return "nats://127.0.0.1:" + strconv.Itoa(b.port) }

// start runs the server and waits until JetStream answers; logFlag is
// os.O_TRUNC the first time, os.O_APPEND after a restart.
func (b *broker) start(ctx context.Context, logFlag int) error {
	proc, err := b.prog.start(logFlag)
	if err != nil {
		return err
	}
	b.proc = proc
	return b.waitReady(ctx, 20*time.Second)
}

// waitReady connects until JetStream answers an account info request.
func (b *broker) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		if nc, err := nats.Connect(b.url(), nats.Timeout(time.Second)); err == nil {
			js, err := jetstream.New(nc)
			if err == nil {
				_, err = js.AccountInfo(ctx)
			}
			nc.Close()
			if err == nil {
				return nil
			}
		}
		select {
		case <-b.proc.done:
			return fmt.Errorf("nats-server exited at start; see %s", b.prog.logPath)
		case <-ctx.Done():
			return fmt.Errorf("nats-server not ready after %s; see %s", timeout, b.prog.logPath)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// halt stops the server gracefully (SIGTERM: a rolling restart's stop),
// killing it if it takes more than 10 s.
func (b *broker) halt() {
	if b.proc != nil {
		b.proc.stop(10 * time.Second)
	}
}

// restart stops the server and starts it again on the same port and
// store, and returns how long it was away.
func (b *broker) restart(ctx context.Context) (time.Duration, error) {
	began := time.Now()
	b.halt()
	err := b.start(ctx, os.O_APPEND)
	return time.Since(began), err
}

// stop halts the server for good and removes its store.
func (b *broker) stop() {
	b.halt()
	os.RemoveAll(b.dir)
}
