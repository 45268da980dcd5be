package testenv

import (
	"bytes"
	"net"
	"sync/atomic"
	"testing"
)

// ReplyCutter is a TCP proxy in front of a Redis server that loses one
// reply: the first command whose bytes contain the trigger is forwarded
// and runs, and when the server's reply comes back the proxy closes the
// connection instead of passing it on, as a failover or a dropped link
// would. The client cannot know whether the command ran.
type ReplyCutter struct {
	trigger []byte
	cut     atomic.Bool
	every   atomic.Bool
}

// CutEvery makes the proxy lose the reply of every command that contains
// the trigger, not only the first: a server that never answers in time.
func (c *ReplyCutter) CutEvery() { c.every.Store(true) }

// NewReplyCutter starts the proxy in front of target and returns it with
// the address to dial instead of target. It stops when the test ends.
func NewReplyCutter(t testing.TB, target string, trigger []byte) (*ReplyCutter, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	c := &ReplyCutter{trigger: trigger}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go c.forward(client, target)
		}
	}()
	return c, ln.Addr().String()
}

// Cut reports whether a reply was lost.
func (c *ReplyCutter) Cut() bool { return c.cut.Load() }

func (c *ReplyCutter) forward(client net.Conn, target string) {
	server, err := net.Dial("tcp", target)
	if err != nil {
		client.Close()
		return
	}
	closeBoth := func() { client.Close(); server.Close() }
	var armed atomic.Bool // the trigger went out on this connection
	go func() {
		defer closeBoth()
		buf := make([]byte, 64<<10)
		for {
			n, err := client.Read(buf)
			if n > 0 {
				if (c.every.Load() || !c.cut.Load()) && bytes.Contains(buf[:n], c.trigger) {
					armed.Store(true)
				}
				if _, werr := server.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	defer closeBoth()
	buf := make([]byte, 64<<10)
	for {
		n, err := server.Read(buf)
		if n > 0 {
			if armed.Load() && (c.cut.CompareAndSwap(false, true) || c.every.Load()) {
				return // the command ran; its reply is lost
			}
			if _, werr := client.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}
