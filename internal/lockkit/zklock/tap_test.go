package zklock

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"net"
	"path"
	"sync"
	"testing"
	"time"
)

// tap sits between the client and the server: it can cut the connection,
// lose the reply to a create, and learn the session's password from the
// handshake, which the client library keeps to itself.
type tap struct {
	mu        sync.Mutex
	ops       map[int32]int // requests sent, by opcode
	conn      *tappedConn
	handshake []byte
	dropCount int
	dropArmed bool
	createXid []byte
	holed     bool
	severOp   int32 // opcode whose next request cuts the connection once sent; 0 for none
	refuse    bool  // dials fail: the server is gone
	refusals  int   // dials still to fail before they succeed again
	// lagArmed: the connection dialled after a dropped create reply is to
	// a member that has not applied the create yet (laggingView);
	// lagging is the node it leaves out, once the drop named it.
	lagArmed bool
	lagging  string
}

func (tp *tap) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	tp.mu.Lock()
	refuse := tp.refuse || tp.refusals > 0
	if tp.refusals > 0 {
		tp.refusals--
	}
	tp.mu.Unlock()
	if refuse {
		return nil, errors.New("tap: refused")
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	tc := &tappedConn{Conn: c, tap: tp}
	tp.mu.Lock()
	tp.conn, tp.handshake = tc, nil
	if tp.lagging != "" {
		tc.lag = &laggingView{hide: tp.lagging, requests: map[int32]int32{}}
		tp.lagging = ""
	}
	tp.mu.Unlock()
	return tc, nil
}

func (tp *tap) sever() {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	_ = tp.conn.Close()
}

// blackhole stops forwarding the client's requests, the connection left
// open: a half-open connection, which the client notices only when its
// read timeout (2/3 of the session timeout) passes without a reply.
func (tp *tap) blackhole() {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.holed = true
}

// severForGood cuts the connection after the next request with opcode op
// is sent, and refuses every dial after it.
func (tp *tap) severForGood(op int32) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.severOp, tp.refuse = op, true
}

// severAfterNext cuts the connection right after the next request with
// opcode op is sent: the server carries it out, its reply is lost.
func (tp *tap) severAfterNext(op int32) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.severOp = op
}

// refuseDials makes the next n dials fail: a reconnect that takes more
// than one try, during which the client fails its queued requests with
// zk.ErrNoServer.
func (tp *tap) refuseDials(n int) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.refusals = n
}

func (tp *tap) dropNextCreateReply() {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.dropArmed = true
}

// dropNextCreateReplyAndLag drops the next create's reply, as
// dropNextCreateReply does, and makes the client reconnect to a member of
// the ensemble that has not applied that create yet: the member the
// client lands on after a lost reply may be any follower, and a follower
// applies a commit a moment after the leader answered it.
func (tp *tap) dropNextCreateReplyAndLag() {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	tp.dropArmed, tp.lagArmed = true, true
}

// Opcodes of go-zookeeper's requests.
const (
	opExists       = 3  // Exists, ExistsW
	opGetData      = 4  // Get, GetW
	opSync         = 9  // Sync
	opGetChildren2 = 12 // Children
)

// sent counts the requests sent so far, by opcode.
func (tp *tap) sent() map[int32]int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return maps.Clone(tp.ops)
}

func (tp *tap) dropped() bool {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return tp.dropCount > 0
}

type tappedConn struct {
	net.Conn
	tap *tap
	lag *laggingView // nil: the member is up to date
}

func (c *tappedConn) Write(b []byte) (int, error) {
	if c.lag != nil && len(b) >= 12 {
		c.lag.sent(int32(binary.BigEndian.Uint32(b[4:8])), int32(binary.BigEndian.Uint32(b[8:12])))
	}
	tp := c.tap
	tp.mu.Lock()
	// A request is [length][xid][opcode]...; opcode 1 is create.
	if len(b) >= 12 {
		if tp.ops == nil {
			tp.ops = map[int32]int{}
		}
		tp.ops[int32(binary.BigEndian.Uint32(b[8:12]))]++
	}
	if tp.dropArmed && len(b) >= 12 && int32(binary.BigEndian.Uint32(b[8:12])) == 1 {
		tp.dropArmed, tp.createXid = false, bytes.Clone(b[4:8])
	}
	holed, sever := tp.holed, false
	if tp.severOp != 0 && len(b) >= 12 && int32(binary.BigEndian.Uint32(b[8:12])) == tp.severOp {
		tp.severOp, sever = 0, true
	}
	tp.mu.Unlock()
	if holed {
		return len(b), nil
	}
	n, err := c.Conn.Write(b)
	if sever {
		_ = c.Conn.Close()
	}
	return n, err
}

func (c *tappedConn) Read(b []byte) (int, error) {
	if c.lag != nil {
		return c.lag.read(c.Conn, b)
	}
	n, err := c.Conn.Read(b)
	tp := c.tap
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if tp.conn == c && len(tp.handshake) < 64 {
		tp.handshake = append(tp.handshake, b[:n]...)
	}
	// The client reads a reply's length, then its body: [xid][zxid][err]...
	if tp.createXid != nil && n >= 16 && bytes.Equal(b[:4], tp.createXid) {
		tp.createXid = nil
		tp.dropCount++
		// [xid][zxid][err][path length][path]
		if tp.lagArmed && n >= 20 {
			if end := 20 + int(binary.BigEndian.Uint32(b[16:20])); end <= n {
				tp.lagArmed, tp.lagging = false, path.Base(string(b[20:end]))
			}
		}
		_ = c.Conn.Close()
		return 0, io.ErrUnexpectedEOF
	}
	return n, err
}

// expire closes the client's session from a second connection that
// presents the same session id and password.
func (tp *tap) expire(t *testing.T) {
	t.Helper()
	tp.mu.Lock()
	hs := bytes.Clone(tp.handshake)
	addr := tp.conn.RemoteAddr().String()
	tp.mu.Unlock()
	// [length][protocolVersion][timeout][sessionId][password length][password]
	if len(hs) < 24 {
		t.Fatalf("handshake not seen: %x", hs)
	}
	body := hs[4:]
	session := binary.BigEndian.Uint64(body[8:16])
	password := body[20 : 20+binary.BigEndian.Uint32(body[16:20])]

	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	var req bytes.Buffer
	for _, v := range []any{int32(0), int64(0), int32(sessionTimeout.Milliseconds()), session, int32(len(password)), password, false} {
		_ = binary.Write(&req, binary.BigEndian, v)
	}
	send := func(body []byte) []byte {
		if err := binary.Write(c, binary.BigEndian, int32(len(body))); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Write(body); err != nil {
			t.Fatal(err)
		}
		var n int32
		if err := binary.Read(c, binary.BigEndian, &n); err != nil {
			t.Fatal(err)
		}
		reply := make([]byte, n)
		if _, err := io.ReadFull(c, reply); err != nil {
			t.Fatal(err)
		}
		return reply
	}
	if reply := send(req.Bytes()); binary.BigEndian.Uint64(reply[8:16]) != session {
		t.Fatalf("second connection did not join session %x: %x", session, reply)
	}
	closeSession := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, 1), uint32(0xfffffff5)) // xid 1, opcode -11
	if reply := send(closeSession); len(reply) < 16 || binary.BigEndian.Uint32(reply[12:16]) != 0 {
		t.Fatalf("closeSession failed: %x", reply)
	}
}

// laggingView is a connection to an ensemble member that has not yet
// applied the create of node hide: its first listing of the node's
// directory leaves hide out, as a follower's would in the moment before
// the leader's commit reaches it, unless a sync on the connection came
// first (a sync answers only once the member has caught up with the
// leader; requests of one session are served in order). From the second
// listing on, the member has caught up.
type laggingView struct {
	hide string

	mu       sync.Mutex
	requests map[int32]int32 // opcode by xid, of the requests that matter here
	synced   bool
	listed   bool

	// Only the client's receiving goroutine reads, so these need no lock;
	// nor may it hold mu while it waits for the server, or the client's
	// next request would wait for that reply.
	greeted bool   // the handshake's reply, which has no xid, went by
	pending []byte // frames already read and rewritten, not yet given out
}

func (v *laggingView) sent(xid, op int32) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if op == opSync || op == opGetChildren2 {
		v.requests[xid] = op
	}
}

// read gives out the server's frames, each read whole and rewritten first.
func (v *laggingView) read(conn net.Conn, b []byte) (int, error) {
	if len(v.pending) == 0 {
		var size [4]byte
		if _, err := io.ReadFull(conn, size[:]); err != nil {
			return 0, err
		}
		body := make([]byte, binary.BigEndian.Uint32(size[:]))
		if _, err := io.ReadFull(conn, body); err != nil {
			return 0, err
		}
		if v.greeted {
			body = v.rewrite(body)
		}
		v.greeted = true
		v.pending = binary.BigEndian.AppendUint32(nil, uint32(len(body)))
		v.pending = append(v.pending, body...)
	}
	n := copy(b, v.pending)
	v.pending = v.pending[n:]
	return n, nil
}

// rewrite takes hide out of a getChildren2 reply the member answers before
// it has caught up. A reply is [xid][zxid][err], then for getChildren2
// [count][name]...[stat].
func (v *laggingView) rewrite(body []byte) []byte {
	if len(body) < 20 {
		return body
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	xid := int32(binary.BigEndian.Uint32(body[:4]))
	op, ok := v.requests[xid]
	delete(v.requests, xid)
	switch {
	case !ok || binary.BigEndian.Uint32(body[12:16]) != 0:
		return body
	case op == opSync:
		v.synced = true
		return body
	case v.synced || v.listed:
		return body
	}
	v.listed = true
	count := int(binary.BigEndian.Uint32(body[16:20]))
	var names [][]byte
	at := 20
	for range count {
		size := int(binary.BigEndian.Uint32(body[at : at+4]))
		names = append(names, body[at+4:at+4+size])
		at += 4 + size
	}
	out := binary.BigEndian.AppendUint32(bytes.Clone(body[:16]), 0)
	kept := 0
	for _, name := range names {
		if string(name) == v.hide {
			continue
		}
		out = binary.BigEndian.AppendUint32(out, uint32(len(name)))
		out = append(out, name...)
		kept++
	}
	binary.BigEndian.PutUint32(out[16:20], uint32(kept))
	return append(out, body[at:]...)
}
