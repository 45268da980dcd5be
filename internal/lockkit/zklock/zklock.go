// Package zklock is the ZooKeeper lockkit backend: the lock recipe of the
// ZooKeeper documentation, as Curator's InterProcessMutex builds it. Each
// acquisition creates an ephemeral sequential node under <root>/<key>; the
// lowest sequence holds the key, and each waiter watches only the node just
// ahead of it, so a release wakes one waiter and grants go in arrival order.
//
// The ZooKeeper session is what keeps a node alive, so a crashed holder's
// key is freed when its session times out. Lease TTLs are kept by this
// client on top of that: when a lease runs out, Lost closes and the node is
// deleted. The fence is the key directory's pzxid as read by the grant, or
// one above the previous holder's when that holder was this Locker's (see
// inherit). docs/backends-zk-etcd.md gives the reasons.
package zklock

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

const (
	// DefaultRoot is the parent of every key's node directory.
	DefaultRoot = "/shop/locks"
	// protected starts every node name, followed by a GUID: a create whose
	// reply was lost can then find the node it made (Curator's protection).
	protected = "_c_"
	// retryDelay paces the deletion of nodes we could not delete at once.
	retryDelay = 250 * time.Millisecond
	// abandonWait bounds how long a caller who gave up (a cancelled
	// waiter, a failed TryAcquire) waits for its node's deletion. On a
	// half-open connection a request only fails after 2/3 of the session
	// timeout; past abandonWait the deletion goes on in the background.
	abandonWait = 250 * time.Millisecond
	// retireAt is the sequence number at which a key directory is retired.
	// The server keeps a directory's count of creates in an int32 and,
	// once it reaches 2^31-1, stops counting: every later node is named
	// ...2147483647 (or, pipelined, -2147483648), and sequence order no
	// longer says who is first. A node numbered at or past retireAt never
	// queues: it leaves, waits for the directory to empty, deletes it, and
	// queues again in a new one whose count starts at 0. Half the range is
	// left as margin: the nodes already queued below it finish first.
	retireAt = 1 << 30
	// maxCuts is how many of a waiter's reads in a row may be cut off by a
	// dropped connection before it gives up with ErrUnavailable.
	maxCuts = 3
)

// errVanished means our node is gone while we queued: the session expired,
// an operator deleted it, or the directory was retired. The acquisition
// queues again at the back.
var errVanished = errors.New("zklock: our node vanished")

// Option configures a Locker.
type Option func(*config)

type config struct {
	root   string
	dialer zk.Dialer
}

// WithRoot sets the node under which key directories live (DefaultRoot).
func WithRoot(root string) Option { return func(c *config) { c.root = strings.TrimSuffix(root, "/") } }

// Locker grants leases as ephemeral sequential nodes over one ZooKeeper
// session, like Curator's single shared session: when the connection drops,
// every lease of this Locker is lost at once.
type Locker struct {
	conn   *zk.Conn
	events <-chan zk.Event
	root   string
	acl    []zk.ACL
	once   sync.Once
	// background runs the deletions that Close waits for; its Done is the
	// Locker's shutdown signal.
	background backend.Group

	mu    sync.Mutex
	nodes map[string]*entry // ours, queued or granted, by node path
	epoch uint64            // bumped whenever the connection drops
	up    chan struct{}     // closed while the client has a session; a new one once it drops

	sessionTimeout time.Duration
}

// entry is one node of ours, from its creation until it is deleted or
// given up. Fields are guarded by Locker.mu.
type entry struct {
	// granted: the node was first in line once, so no node is ever ahead
	// of it again; fence is its lease's token.
	granted bool
	fence   uint64
	// watched: a watch on the node was set while it existed, in epoch
	// watchEpoch, and has not fired since. While the epoch is unchanged the
	// connection never dropped, so deleted is then the whole truth.
	watched    bool
	watchEpoch uint64
	deleted    bool
	// released is closed when our release's own Delete of the node has
	// returned, and releasedOK says it deleted it: a single-node
	// transaction, whose zxid deleted nothing else (inherit).
	released   chan struct{}
	releasedOK bool
	releaseErr error // what release answers once released is closed

	// From the grant on:
	gone    chan struct{} // closed when the node or the connection is gone
	timer   *time.Timer   // deletes the node once the lease has run out
	lease   lockkit.Lease
	session int64 // that owns the node
}

// New connects to the ensemble at addrs and waits, at most sessionTimeout,
// for a session. The server may negotiate the timeout within its bounds.
func New(addrs []string, sessionTimeout time.Duration, opts ...Option) (*Locker, error) {
	cfg := config{root: DefaultRoot, dialer: net.DialTimeout}
	for _, o := range opts {
		o(&cfg)
	}
	l := &Locker{
		root: cfg.root, acl: zk.WorldACL(zk.PermAll),
		nodes: make(map[string]*entry), up: make(chan struct{}),
		sessionTimeout: sessionTimeout,
	}
	conn, events, err := zk.Connect(addrs, sessionTimeout, zk.WithDialer(cfg.dialer),
		zk.WithEventCallback(l.onEvent), zk.WithLogger(zkLogger{}), zk.WithLogInfo(false))
	if err != nil {
		return nil, fmt.Errorf("%w: zookeeper: %w", lockkit.ErrUnavailable, err)
	}
	l.conn, l.events = conn, events
	l.mu.Lock()
	up := l.up
	l.mu.Unlock()
	select {
	case <-up:
		return l, nil
	case <-time.After(sessionTimeout):
		_ = l.Close()
		return nil, fmt.Errorf("%w: zookeeper: no session with %v within %v", lockkit.ErrUnavailable, addrs, sessionTimeout)
	}
}

// Capabilities of the ZooKeeper backend.
func (l *Locker) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{Fencing: true, WaitNoPoll: true, Fair: true, LostSignal: true,
		Expires: true, OwnerCheck: true, CrossProcess: true}
}

// onEvent runs inside the client's goroutines: it must not block, nor call
// the client.
func (l *Locker) onEvent(ev zk.Event) {
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case ev.Type == zk.EventNodeDeleted:
		if e := l.nodes[ev.Path]; e != nil {
			e.deleted, e.watched = true, false
			if e.gone != nil {
				closeOnce(e.gone) // deleted behind our back (or by our own release: harmless)
			}
		}
	case ev.Type != zk.EventSession:
		if e := l.nodes[ev.Path]; e != nil {
			e.watched = false // spent by another change: a deletion would now go unseen
		}
	case ev.State == zk.StateHasSession:
		closeOnce(l.up)
	case ev.State == zk.StateDisconnected || ev.State == zk.StateExpired:
		select {
		case <-l.up:
			l.up = make(chan struct{})
		default:
		}
		// Curator's default policy: SUSPENDED counts as lost. From the
		// moment the connection drops we cannot know whether the server
		// has expired the session and handed our keys to others.
		l.epoch++
		for _, e := range l.nodes {
			if e.gone != nil {
				closeOnce(e.gone)
			}
		}
	}
}

// Close ends the session, which deletes every node this Locker still has:
// unlike stores with server-side TTLs, held keys are freed at once.
func (l *Locker) Close() error {
	l.once.Do(func() {
		l.mu.Lock()
		l.background.Stop()
		for _, e := range l.nodes {
			if e.timer != nil {
				e.timer.Stop()
			}
		}
		l.mu.Unlock()
		l.conn.Close()
		l.background.Wait()
		l.awaitClientEnd()
	})
	return nil
}

// awaitClientEnd waits for the client's goroutines to end (its events
// channel closes then), at most sessionTimeout: go-zookeeper's loop was
// seen blocked for good in flushRequests under a lost quorum, and a
// Close that waits for it would never return.
func (l *Locker) awaitClientEnd() {
	limit := time.After(l.sessionTimeout)
	for {
		select {
		case _, open := <-l.events:
			if !open {
				return
			}
		case <-limit:
			return
		}
	}
}

// Acquire queues for key and waits until every node ahead of ours is gone.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return l.acquire(ctx, key, opts, true)
}

// TryAcquire queues for key and, if a node is ahead of ours, deletes ours
// and returns ErrNotAcquired.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return l.acquire(ctx, key, opts, false)
}

// The client library takes no contexts: each call is bounded by the
// connection's own timeouts, and ctx is checked between calls and while
// waiting for the predecessor.
func (l *Locker) acquire(ctx context.Context, key string, opts []lockkit.Option, wait bool) (lockkit.Lease, error) {
	o, watchdog := backend.Resolve(opts)
	waitCtx, cancel := backend.WaitContext(ctx, o)
	defer cancel()
	dir := l.dir(key)
	for {
		if waitCtx.Err() != nil {
			return nil, backend.WaitErr(ctx, waitCtx)
		}
		node, err := l.create(waitCtx, dir)
		if err != nil {
			return nil, err
		}
		t := ticket{key: key, node: node, session: l.conn.SessionID(), o: o, watchdog: watchdog, wait: wait}
		lease, err := l.queue(ctx, waitCtx, t)
		if !errors.Is(err, errVanished) {
			return lease, err
		}
	}
}

// ticket is one acquisition's node in key's queue, created in session;
// wait: Acquire, not TryAcquire.
type ticket struct {
	key, node      string
	session        int64
	o              lockkit.Options
	watchdog, wait bool
}

// queue waits until t's node is the lowest in its directory and grants it.
func (l *Locker) queue(ctx, waitCtx context.Context, t ticket) (_ lockkit.Lease, err error) {
	node, wait := t.node, t.wait
	dir, name := path.Dir(node), path.Base(node)
	e := &entry{}
	l.mu.Lock()
	l.nodes[node] = e
	l.mu.Unlock()
	defer func() {
		if err != nil {
			l.forget(node)
		}
	}()
	cuts := 0 // requests in a row cut off with the connection
	for {
		l.mu.Lock()
		epoch := l.epoch
		l.mu.Unlock()
		children, dirStat, err := l.conn.Children(dir)
		if l.cutOff(waitCtx, err, &cuts) {
			continue
		}
		if err != nil {
			return nil, l.giveUp(ctx, waitCtx, node, err)
		}
		cuts = 0
		if pastRetirement(name) {
			l.abandon(node)
			return nil, l.retire(ctx, waitCtx, dir, wait)
		}
		pred, found := predecessor(children, name)
		switch {
		case !found:
			return nil, errVanished
		case pred == "":
			return l.grant(t, e, epoch, uint64(dirStat.Pzxid))
		case !wait:
			l.abandon(node)
			return nil, lockkit.ErrNotAcquired
		}
		l.mu.Lock()
		ahead := l.nodes[dir+"/"+pred] // nil unless it is ours
		l.mu.Unlock()
		changed, err := l.watchAhead(dir+"/"+pred, node, e)
		switch {
		case errors.Is(err, errVanished):
			return nil, err
		case l.cutOff(waitCtx, err, &cuts):
			continue
		case err != nil:
			return nil, l.giveUp(ctx, waitCtx, node, err)
		case changed == nil:
			continue // gone already
		}
		ev, err := l.awaitChange(ctx, waitCtx, node, changed)
		if err != nil {
			return nil, err
		}
		if fence, epoch, ok := l.inherit(waitCtx, e, ahead, ev); ok {
			return l.grant(t, e, epoch, fence)
		}
	}
}

// watchAhead sets the watches a waiter needs: one on pred, the node just
// ahead of ours, whose deletion or any change wakes us to look again, and
// one on our own node (watchQueued). changed is nil if pred is gone.
func (l *Locker) watchAhead(pred, node string, e *entry) (changed <-chan zk.Event, err error) {
	// A data watch, not exists: on a node already gone it leaves no
	// watch behind (Curator's choice).
	_, _, changed, err = l.conn.GetW(pred)
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err == nil {
		err = l.watchQueued(node, e)
	}
	return changed, err
}

// awaitChange waits for the event on the node ahead of ours; a wait that
// ends first abandons our node.
func (l *Locker) awaitChange(ctx, waitCtx context.Context, node string, changed <-chan zk.Event) (zk.Event, error) {
	select {
	case ev := <-changed:
		return ev, nil
	case <-waitCtx.Done():
		l.abandon(node)
		return zk.Event{}, backend.WaitErr(ctx, waitCtx)
	case <-l.background.Done():
		return zk.Event{}, lockkit.ErrClosed
	}
}

// giveUp abandons a waiting node after err, which it maps to lockkit's:
// the wait's own end if it came first (cutOff waits within it).
func (l *Locker) giveUp(ctx, waitCtx context.Context, node string, err error) error {
	l.abandon(node)
	if waitCtx.Err() != nil {
		return backend.WaitErr(ctx, waitCtx)
	}
	return l.fail(err)
}

// cutOff says whether a waiter's read failed only because the connection
// dropped before its reply, and should be asked again once the client has
// a session: the listing that follows shows whether our node outlived the
// drop (errVanished if the session did not). It waits for the session
// at most sessionTimeout, past which the server has expired ours anyway,
// and no longer than waitCtx; the client itself would hold a request for
// as long as it takes. After maxCuts in a row, or with no session in
// time, the caller fails with err.
func (l *Locker) cutOff(waitCtx context.Context, err error, cuts *int) bool {
	var netErr net.Error // a request whose own write failed gets the socket's error
	// The client fails requests queued while it reconnects with ErrNoServer.
	cut := errors.Is(err, zk.ErrConnectionClosed) || errors.Is(err, zk.ErrNoServer) || errors.As(err, &netErr)
	if !cut || *cuts == maxCuts {
		return false
	}
	if backend.IsClosed(l.background.Done()) {
		return false // closing: the client's requests fail for good
	}
	*cuts++
	l.mu.Lock()
	up := l.up
	l.mu.Unlock()
	reconnect := time.NewTimer(l.sessionTimeout)
	defer reconnect.Stop()
	select {
	case <-up:
		return true
	case <-waitCtx.Done():
	case <-reconnect.C:
	case <-l.background.Done():
	}
	return false
}

// fail maps a client error to lockkit's.
func (l *Locker) fail(err error) error {
	select {
	case <-l.background.Done():
		return lockkit.ErrClosed
	default:
	}
	if errors.Is(err, zk.ErrClosing) {
		return lockkit.ErrClosed
	}
	return fmt.Errorf("%w: zookeeper: %w", lockkit.ErrUnavailable, err)
}

func closeOnce(ch chan struct{}) {
	select {
	case <-ch:
	default:
		close(ch)
	}
}

// zkLogger sends the client's complaints (lost connections, mostly) to slog.
type zkLogger struct{}

func (zkLogger) Printf(format string, args ...any) {
	slog.Warn(fmt.Sprintf(format, args...), "backend", "zookeeper")
}
