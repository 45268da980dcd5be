package locktest

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Wire stands between a client and its servers. Every connection passes
// through a TCP proxy on loopback, so a test can count what the client
// sends and silence the server the way a partition does: the sockets stay
// open, the bytes stop arriving, and each side's writes pile up in its
// buffers until the wire heals.
//
// Give a client w.DialContext as its dialer (go-redis, gRPC), or w.Proxy(addr)
// in place of each server address (DSNs, address lists).
type Wire struct {
	t testing.TB

	mu      sync.Mutex
	proxies map[string]string // server address -> proxy address
	lns     []net.Listener
	conns   map[net.Conn]struct{}
	up      chan struct{}   // closed while client-to-server bytes flow
	down    chan struct{}   // closed while server-to-client bytes flow
	held    []chan struct{} // one per reply held, oldest first
	closed  chan struct{}
	wg      sync.WaitGroup

	writes atomic.Int64
	bytes  atomic.Int64
}

// NewWire returns a wire that is closed, with every connection through it,
// when t ends.
func NewWire(t testing.TB) *Wire {
	w := &Wire{
		t:       t,
		proxies: make(map[string]string),
		conns:   make(map[net.Conn]struct{}),
		up:      closedCh(),
		down:    closedCh(),
		closed:  make(chan struct{}),
	}
	t.Cleanup(w.close)
	return w
}

func closedCh() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}

// Proxy returns the loopback address that forwards to server.
func (w *Wire) Proxy(server string) string {
	addr, err := w.proxy(server)
	if err != nil {
		w.t.Fatalf("wire: proxy to %s: %v", server, err)
	}
	return addr
}

// DialContext dials addr through the wire; its signature fits go-redis's
// Dialer and, with network "tcp", gRPC's WithContextDialer.
func (w *Wire) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	proxy, err := w.proxy(addr)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	return d.DialContext(ctx, network, proxy)
}

// Calls is how many writes the client has made through the wire, a
// request's worth each in the request-reply protocols of lock servers
// (a pipelined batch counts once), and Bytes how many bytes they carried.
// Both count what the client sent, also while the wire is silent.
func (w *Wire) Calls() int64 { return w.writes.Load() }

// Bytes is how many bytes the client has sent through the wire.
func (w *Wire) Bytes() int64 { return w.bytes.Load() }

// CountCall records a call by a client without a network (an in-process
// backend counting its own store operations), so the suite can read it
// with Calls like any other.
func (w *Wire) CountCall() { w.writes.Add(1) }

// BlackHole stops forwarding in both directions, connections left open.
func (w *Wire) BlackHole() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.up, w.down = openIfClosed(w.up), openIfClosed(w.down)
}

// HoldReplies stops forwarding from the servers to the client only: the
// client's requests reach the servers and are applied, their replies wait.
func (w *Wire) HoldReplies() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.down = openIfClosed(w.down)
}

// HealRepliesNewestFirst delivers the held replies one connection at a
// time, the newest first, a few milliseconds apart, then heals: replies on
// different connections may arrive in any order, and this is the order
// that finds a client trusting the reply it processed last.
func (w *Wire) HealRepliesNewestFirst() {
	w.mu.Lock()
	held := w.held
	w.held = nil
	w.mu.Unlock()
	for i := len(held) - 1; i >= 0; i-- {
		close(held[i])
		time.Sleep(20 * time.Millisecond)
	}
	w.Heal()
}

// Heal forwards again, in order, what was held.
func (w *Wire) Heal() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.held = nil
	for _, ch := range []chan struct{}{w.up, w.down} {
		select {
		case <-ch:
		default:
			close(ch)
		}
	}
}

func openIfClosed(ch chan struct{}) chan struct{} {
	select {
	case <-ch:
		return make(chan struct{})
	default:
		return ch // already silent
	}
}

func (w *Wire) proxy(server string) (string, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if addr, ok := w.proxies[server]; ok {
		return addr, nil
	}
	select {
	case <-w.closed:
		return "", net.ErrClosed
	default:
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	w.lns = append(w.lns, ln)
	w.proxies[server] = ln.Addr().String()
	w.wg.Go(func() { w.accept(ln, server) })
	return ln.Addr().String(), nil
}

func (w *Wire) accept(ln net.Listener, server string) {
	for {
		client, err := ln.Accept()
		if err != nil {
			return
		}
		w.wg.Go(func() { w.forward(client, server) })
	}
}

func (w *Wire) forward(client net.Conn, server string) {
	if !w.track(client) {
		return
	}
	// A silent network does not complete new handshakes either.
	if !w.wait(false) {
		return
	}
	upstream, err := net.Dial("tcp", server)
	if err != nil {
		_ = client.Close()
		return
	}
	if !w.track(upstream) {
		return
	}
	var done sync.WaitGroup
	done.Go(func() { w.pump(upstream, client, false) })
	done.Go(func() { w.pump(client, upstream, true) })
	done.Wait()
}

// track registers c to be closed with the wire; false if the wire is
// already closed (c is then closed).
func (w *Wire) track(c net.Conn) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	select {
	case <-w.closed:
		_ = c.Close()
		return false
	default:
		w.conns[c] = struct{}{}
		return true
	}
}

// pump copies src to dst, holding each chunk while its direction is
// silent. Either side closing closes both.
func (w *Wire) pump(dst, src net.Conn, reply bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if !reply {
				w.writes.Add(1)
				w.bytes.Add(int64(n))
			}
			if !w.wait(reply) {
				return
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// wait blocks while the direction (replies or requests) is silent; false
// once the wire is closed. A held reply can be let through on its own.
func (w *Wire) wait(reply bool) bool {
	for {
		w.mu.Lock()
		gate := w.up
		if reply {
			gate = w.down
		}
		select {
		case <-gate:
			w.mu.Unlock()
			return true
		default:
		}
		var ticket chan struct{}
		if reply {
			ticket = make(chan struct{})
			w.held = append(w.held, ticket)
		}
		w.mu.Unlock()
		select {
		case <-gate: // look again: it may have been silenced anew
		case <-ticket:
			return true
		case <-w.closed:
			return false
		}
	}
}

func (w *Wire) close() {
	w.mu.Lock()
	select {
	case <-w.closed:
		w.mu.Unlock()
		return
	default:
	}
	close(w.closed)
	for _, ln := range w.lns {
		_ = ln.Close()
	}
	for c := range w.conns {
		_ = c.Close()
	}
	w.mu.Unlock()
	w.wg.Wait()
}
