package lockbench

import (
	"bufio"
	"encoding/binary"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// zkCounter forwards ZooKeeper connections to one server and counts, frame
// by frame, the requests the clients send and the watch notifications the
// server sends them. Counts, not timings: they repeat on a loaded machine.
type zkCounter struct {
	addr   string
	server string

	requests      atomic.Int64 // client frames with a request's xid (pings and the handshake left out)
	replies       atomic.Int64 // server frames answering one of those
	notifications atomic.Int64 // server frames with xid -1: a watch fired
	last          atomic.Int64 // unix nanoseconds of the last frame, either way
}

// ZooKeeper's reserved xids: a notification, a ping.
const (
	xidNotification = -1
	xidPing         = -2
)

func newZKCounter(b testing.TB, server string) *zkCounter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	z := &zkCounter{addr: ln.Addr().String(), server: server}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			upstream, err := net.Dial("tcp", server)
			if err != nil {
				_ = client.Close()
				continue
			}
			track(client)
			track(upstream)
			wg.Go(func() { z.pump(upstream, client, false) })
			wg.Go(func() { z.pump(client, upstream, true) })
		}
	})
	b.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return z
}

// pump copies length-prefixed frames from src to dst, counting them; the
// first frame each way is the session handshake.
func (z *zkCounter) pump(dst, src net.Conn, fromServer bool) {
	defer dst.Close()
	defer src.Close()
	r := bufio.NewReader(src)
	for n := 0; ; n++ {
		var size [4]byte
		if _, err := io.ReadFull(r, size[:]); err != nil {
			return
		}
		frame := make([]byte, 4+binary.BigEndian.Uint32(size[:]))
		copy(frame, size[:])
		if _, err := io.ReadFull(r, frame[4:]); err != nil {
			return
		}
		if n > 0 && len(frame) >= 8 {
			z.count(int32(binary.BigEndian.Uint32(frame[4:8])), fromServer)
		}
		z.last.Store(time.Now().UnixNano())
		if _, err := dst.Write(frame); err != nil {
			return
		}
	}
}

func (z *zkCounter) count(xid int32, fromServer bool) {
	switch {
	case fromServer && xid == xidNotification:
		z.notifications.Add(1)
	case xid < 0: // pings, and the replies to them
	case fromServer:
		z.replies.Add(1)
	default:
		z.requests.Add(1)
	}
}

// settle returns once the clients have sent more than sent requests,
// every request has its reply, and nothing has crossed for quiet: the
// wake-ups of the last change have all been served. quiet bounds how long
// a client may take between a notification and the request it causes.
func (z *zkCounter) settle(sent int64, quiet time.Duration) {
	for {
		requests := z.requests.Load()
		idle := time.Since(time.Unix(0, z.last.Load()))
		if requests > sent && requests == z.replies.Load() && idle >= quiet {
			return
		}
		time.Sleep(max(time.Millisecond, quiet-idle))
	}
}
