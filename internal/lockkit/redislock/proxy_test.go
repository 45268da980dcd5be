package redislock_test

import (
	"bytes"
	"net"
	"sync"
	"testing"
)

// proxy forwards TCP to a Redis server and can fail the way networks do:
// stop forwarding altogether (a black hole: connections stay open, nothing
// arrives), stop forwarding only on subscriber connections, or only on
// the connections opened from now on, or cut the subscriber connections.
// A subscriber connection is one that has sent SUBSCRIBE (as a RESP
// bulk string, so that a key merely containing the word does not count).
type proxy struct {
	addr   string
	target string

	mu                sync.Mutex
	changed           *sync.Cond // broadcast when a state below changes
	blackholed        bool
	freezeSubscribers bool
	stallNew          bool
	conns             map[*proxyConn]struct{}
	closed            bool
}

type proxyConn struct {
	client, server net.Conn
	subscriber     bool // guarded by proxy.mu
	stalled        bool // guarded by proxy.mu
	done           bool // guarded by proxy.mu
}

func newProxy(t *testing.T, target string) *proxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{addr: ln.Addr().String(), target: target, conns: make(map[*proxyConn]struct{})}
	p.changed = sync.NewCond(&p.mu)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			pc := &proxyConn{client: c, server: s}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				c.Close()
				s.Close()
				return
			}
			pc.stalled = p.stallNew
			p.conns[pc] = struct{}{}
			p.mu.Unlock()
			wg.Go(func() { p.pipe(pc, s, c, true) })
			wg.Go(func() { p.pipe(pc, c, s, false) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		p.closed = true
		for pc := range p.conns {
			p.drop(pc)
		}
		p.mu.Unlock()
		wg.Wait()
	})
	return p
}

// pipe copies src to dst, holding every chunk while the proxy says so.
func (p *proxy) pipe(pc *proxyConn, dst, src net.Conn, fromClient bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if fromClient && bytes.Contains(bytes.ToLower(buf[:n]), []byte("$9\r\nsubscribe\r\n")) {
				pc.subscriber = true
			}
			for !pc.done && (p.blackholed || pc.stalled || p.freezeSubscribers && pc.subscriber) {
				p.changed.Wait()
			}
			done := pc.done
			p.mu.Unlock()
			if done {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				err = werr
			}
		}
		if err != nil {
			p.mu.Lock()
			p.drop(pc)
			p.mu.Unlock()
			return
		}
	}
}

// drop closes both ends of pc; called with p.mu held.
func (p *proxy) drop(pc *proxyConn) {
	if pc.done {
		return
	}
	pc.done = true
	pc.client.Close()
	pc.server.Close()
	delete(p.conns, pc)
	p.changed.Broadcast()
}

func (p *proxy) set(f func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f()
	p.changed.Broadcast()
}

// blackhole stops (true) or resumes (false) forwarding on every connection.
func (p *proxy) blackhole(on bool) { p.set(func() { p.blackholed = on }) }

// freeze stops (true) or resumes (false) forwarding on subscriber connections.
func (p *proxy) freeze(on bool) { p.set(func() { p.freezeSubscribers = on }) }

// stall stops forwarding on the connections opened from now on (true), as
// a server that accepts them and never answers, or resumes them (false).
func (p *proxy) stall(on bool) {
	p.set(func() {
		p.stallNew = on
		for pc := range p.conns {
			pc.stalled = pc.stalled && on
		}
	})
}

// killSubscribers cuts every subscriber connection, dropping what it held.
func (p *proxy) killSubscribers() {
	p.set(func() {
		for pc := range p.conns {
			if pc.subscriber {
				p.drop(pc)
			}
		}
	})
}
