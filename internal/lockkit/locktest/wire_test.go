package locktest

import (
	"bufio"
	"context"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

// echo is a line-echo server that counts the lines it received.
func echo(t *testing.T) (addr string, received *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	received = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					received.Add(1)
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), received
}

// echoClient talks to echo through a Wire.
type echoClient struct {
	t        *testing.T
	conn     net.Conn
	r        *bufio.Reader
	received *atomic.Int64
}

func (c *echoClient) ask(line string) {
	c.t.Helper()
	if _, err := c.conn.Write([]byte(line + "\n")); err != nil {
		c.t.Fatal(err)
	}
}

func (c *echoClient) answer(within time.Duration) (string, bool) {
	c.t.Helper()
	_ = c.conn.SetReadDeadline(time.Now().Add(within))
	got, err := c.r.ReadString('\n')
	return got, err == nil
}

// waitFor waits until the server has received n lines.
func (c *echoClient) waitFor(n int64) {
	c.t.Helper()
	for end := time.Now().Add(5 * time.Second); c.received.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			c.t.Fatalf("server received %d lines, want %d", c.received.Load(), n)
		}
	}
}

func TestWire(t *testing.T) {
	// Registered first, so it runs after the wire and the server closed.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	server, received := echo(t)
	w := NewWire(t)
	conn, err := w.DialContext(context.Background(), "tcp", server)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := &echoClient{t: t, conn: conn, r: bufio.NewReader(conn), received: received}

	c.ask("one")
	if got, ok := c.answer(5 * time.Second); !ok || got != "one\n" {
		t.Fatalf("through a healthy wire: %q", got)
	}
	if w.Calls() != 1 || w.Bytes() != 4 {
		t.Fatalf("counted %d calls, %d bytes; want 1, 4", w.Calls(), w.Bytes())
	}

	w.HoldReplies()
	c.ask("two")
	c.waitFor(2) // the request got through
	if got, ok := c.answer(100 * time.Millisecond); ok {
		t.Fatalf("a held reply arrived: %q", got)
	}
	w.HealRepliesNewestFirst()
	if got, ok := c.answer(5 * time.Second); !ok || got != "two\n" {
		t.Fatalf("held reply after healing: %q", got)
	}

	w.BlackHole()
	c.ask("three")
	time.Sleep(100 * time.Millisecond)
	if received.Load() != 2 {
		t.Fatal("a request crossed a silent wire")
	}
	if w.Calls() != 3 {
		t.Fatalf("counted %d calls; what the client sent counts while silent too", w.Calls())
	}
	w.Heal()
	if got, ok := c.answer(5 * time.Second); !ok || got != "three\n" {
		t.Fatalf("request held while silent, after healing: %q", got)
	}
}
