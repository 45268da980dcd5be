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
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"path"
	"strconv"
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
	// reconnectSettle is how long after its session is back a cut-off
	// waiter waits before it asks again (see cutOff): a guard against a
	// data race in the client on reconnecting, not a speed-up; it is
	// paid only after a dropped connection.
	reconnectSettle = 20 * time.Millisecond
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
		for range l.events { // closed once the client's goroutines have ended
		}
	})
	return nil
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
		node, err := l.create(dir)
		if err != nil {
			return nil, err
		}
		session := l.conn.SessionID()
		lease, err := l.queue(ctx, waitCtx, key, node, session, o, watchdog, wait)
		if !errors.Is(err, errVanished) {
			return lease, err
		}
	}
}

// create makes our node in dir. If the reply is lost the node may exist
// all the same, held by our live session and blocking the key for ever:
// its GUID finds it again.
func (l *Locker) create(dir string) (string, error) {
	prefix := dir + "/" + protected + rand.Text() + "-lock-"
	for attempt := 0; ; attempt++ {
		node, err := l.conn.Create(prefix, nil, zk.FlagEphemeral|zk.FlagSequence, l.acl)
		switch {
		case err == nil:
			return node, nil
		case attempt == 3:
			l.abandon(prefix)
			return "", l.fail(err)
		case errors.Is(err, zk.ErrNoNode):
			if err := l.mkdirs(dir); err != nil {
				return "", err
			}
		case errors.Is(err, zk.ErrConnectionClosed):
			// Sent, but the connection closed before the reply.
			node, err := l.find(prefix)
			if err != nil {
				l.abandon(prefix)
				return "", l.fail(err)
			}
			if node != "" {
				return node, nil
			}
		case errors.Is(err, zk.ErrSessionExpired):
			// Whatever was created went with the session: try again.
		default:
			return "", l.fail(err)
		}
	}
}

// find returns the node whose path starts with prefix (its GUID makes it
// unique), "" if there is none.
func (l *Locker) find(prefix string) (string, error) {
	dir := path.Dir(prefix)
	children, _, err := l.conn.Children(dir)
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return "", err
	}
	for _, c := range children {
		if strings.HasPrefix(dir+"/"+c, prefix) {
			return dir + "/" + c, nil
		}
	}
	return "", nil
}

// queue waits until node is the lowest in its directory and grants it.
func (l *Locker) queue(ctx, waitCtx context.Context, key, node string, session int64, o lockkit.Options, watchdog, wait bool) (_ lockkit.Lease, err error) {
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
			return l.grant(key, node, e, epoch, session, uint64(dirStat.Pzxid), o, watchdog)
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
			return l.grant(key, node, e, epoch, session, fence, o, watchdog)
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
	if !errors.Is(err, zk.ErrConnectionClosed) && !errors.As(err, &netErr) || *cuts == maxCuts {
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
		// go-zookeeper (v1.0.4) reads its last zxid for the SetWatches it
		// sends on reconnecting while its receive loop may already write it
		// from a reply (an open go-zookeeper data race). A
		// request sent the instant the session is back races it; asked a
		// moment later, its reply comes after that read.
		reconnect.Reset(reconnectSettle)
		select {
		case <-reconnect.C:
			return true
		case <-waitCtx.Done():
		case <-l.background.Done():
		}
	case <-waitCtx.Done():
	case <-reconnect.C:
	case <-l.background.Done():
	}
	return false
}

// retire waits until dir, whose count has passed retireAt, is empty, then
// deletes it. It returns errVanished when the caller should queue again:
// the directory is gone (ours or another client's deletion), or a node
// arrived in the instant between the listing and the deletion. Nodes that
// queued below retireAt are served first; every other node leaves at once.
func (l *Locker) retire(ctx, waitCtx context.Context, dir string, wait bool) error {
	for {
		children, _, changed, err := l.conn.ChildrenW(dir)
		switch {
		case errors.Is(err, zk.ErrNoNode):
			return errVanished
		case err != nil:
			return l.fail(err)
		case len(children) == 0:
			// Deletes only an empty directory, whoever else tries at once.
			err := l.conn.Delete(dir, -1)
			if err == nil || errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrNotEmpty) {
				return errVanished
			}
			return l.fail(err)
		case !wait:
			return lockkit.ErrNotAcquired
		}
		select {
		case <-changed:
		case <-waitCtx.Done():
			return backend.WaitErr(ctx, waitCtx)
		case <-l.background.Done():
			return lockkit.ErrClosed
		}
	}
}

// watchQueued sets, once per epoch, the watch on our waiting node that
// inherit relies on and that the lease's Lost needs after the grant. It
// returns errVanished if the node is gone.
func (l *Locker) watchQueued(node string, e *entry) error {
	l.mu.Lock()
	if e.watched && e.watchEpoch == l.epoch {
		l.mu.Unlock()
		return nil
	}
	// Armed before the request is sent, so that an event onEvent sees
	// meanwhile disarms it rather than being overwritten.
	e.watched, e.watchEpoch = !e.deleted, l.epoch
	l.mu.Unlock()
	exists, _, _, err := l.conn.ExistsW(node)
	switch {
	case err != nil:
		return err
	case !exists:
		return errVanished
	}
	return nil
}

// inherit grants, without listing the queue again, a node whose
// predecessor was this Locker's and had been granted: nothing could queue
// ahead of the predecessor since, so its deletion (ev) leaves our node
// first. Our node must still be there: its watch, unbroken since it was
// set, has seen no deletion, and notifications arrive in zxid order, so a
// deletion before the predecessor's would have been seen first. One
// deletion that order cannot show is one in the same transaction as the
// predecessor's (a session's end deletes all its nodes at one zxid, and
// so may an operator's multi): so the predecessor's deletion must be our
// release's own Delete, confirmed, which deleted that node alone. Its
// reply follows the notification on the same connection; any other
// deletion lists the queue again.
//
// The fence is the predecessor's plus one. A fence is always below the
// zxid that deletes its node: a pzxid read before that deletion, or, by
// induction, at most the predecessor's deletion zxid. So this one is
// still below every later listing's pzxid, and above the predecessor's.
// It saves the listing that follows a hand-off, the one request of it
// that queues behind the session's pending writes.
//
// It earns its place: with the waiter listing the queue again instead
// (the recipe's way), lockbench's Contended run made 0.87× the cycles/s
// (0.37-1.18 per round) on one server and 0.82× (0.41-1.05) on 3 members:
// medians of 15 interleaved A/B rounds (docs/backends-zk-etcd.md).
func (l *Locker) inherit(ctx context.Context, e, ahead *entry, ev zk.Event) (fence, epoch uint64, ok bool) {
	if ahead == nil || ev.Type != zk.EventNodeDeleted {
		return 0, 0, false
	}
	l.mu.Lock()
	released := ahead.released
	l.mu.Unlock()
	if released == nil {
		return 0, 0, false // not deleted by our release
	}
	select {
	case <-released:
	case <-ctx.Done():
		return 0, 0, false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !ahead.releasedOK || !ahead.granted || !e.watched || e.deleted || e.watchEpoch != l.epoch {
		return 0, 0, false
	}
	return ahead.fence + 1, l.epoch, true
}

// grant turns our first-in-line node into a lease. epoch is from before we
// saw the node first: if the connection dropped since, the lease is born
// lost, as it would have been lost had it been granted a moment earlier.
//
// Unless inherited (see inherit), the fence is the directory's pzxid as
// read with the children list that showed our node first: the zxid of the
// directory's last change of children. Our turn came only after the
// previous holder's node was deleted, a change of children above the
// previous holder's token, so every grant's token is above every earlier
// grant's. It costs no request
// beyond the list we read anyway (a node's czxid would cost a read after the
// grant); sequence numbers would not do: they restart if the directory is
// ever recreated.
func (l *Locker) grant(key, node string, e *entry, epoch uint64, session int64, fence uint64, o lockkit.Options, watchdog bool) (lockkit.Lease, error) {
	sent := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	e.granted, e.fence = true, fence
	e.gone = make(chan struct{})
	if l.epoch != epoch || e.deleted {
		close(e.gone)
	}
	// Under mu: expire and extend must see both the timer and the lease.
	e.session = session
	e.timer = time.AfterFunc(time.Until(sent.Add(o.TTL)), func() { l.expire(node, e) })
	e.lease = backend.NewLease(backend.Grant{
		Key: key, Fence: fence, TTL: o.TTL, Watchdog: watchdog, Sent: sent,
		Extend:  func(_ context.Context, ttl time.Duration) error { return l.extend(node, e, ttl) },
		Release: func(ctx context.Context) error { return l.release(ctx, node, e) },
		Gone:    e.gone,
		Closed:  l.background.Done(),
	})
	if !e.watched || e.watchEpoch != epoch {
		go l.watchOwn(node, e)
	}
	return e.lease, nil
}

// watchOwn sets a watch on our granted node, whose deletion (an operator,
// an expired session) onEvent turns into Lost at once. It runs after the
// grant, off the holder's path; a node already gone by then is lost now.
// A node that waited has its watch already (watchQueued).
func (l *Locker) watchOwn(node string, e *entry) {
	exists, _, _, err := l.conn.ExistsW(node)
	if err == nil && !exists {
		l.mu.Lock()
		closeOnce(e.gone)
		l.mu.Unlock()
	}
}

// extend checks the node is still ours and moves its deletion to ttl from
// now. ZooKeeper itself keeps the node as long as the session lives.
func (l *Locker) extend(node string, h *entry, ttl time.Duration) error {
	sent := time.Now()
	ok, stat, err := l.conn.Exists(node)
	if err != nil {
		return l.fail(err)
	}
	if !ok || stat.EphemeralOwner != l.conn.SessionID() {
		return lockkit.ErrNotHeld
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !h.timer.Stop() {
		return lockkit.ErrNotHeld // ran out meanwhile: expire is deleting it
	}
	h.timer.Reset(time.Until(sent.Add(ttl)))
	return nil
}

// release deletes the node. Its name holds a GUID and a sequence number
// that no other client ever gets, so deleting it is owner-checked. The
// client takes no context, so the deletion runs in a goroutine and release
// returns when ctx ends; the deletion goes on, retried if it fails. A
// release called again waits for that same deletion's outcome.
func (l *Locker) release(ctx context.Context, node string, h *entry) error {
	l.mu.Lock()
	started := h.released != nil
	expired := !started && !h.timer.Stop()
	if !started && !expired {
		h.released = make(chan struct{})
	}
	done := h.released
	l.mu.Unlock()
	if expired {
		l.forget(node)
		return lockkit.ErrNotHeld
	}
	if !started && !l.background.Go(func() { l.settleRelease(node, h, l.conn.Delete(node, -1)) }) {
		l.settleRelease(node, h, zk.ErrClosing) // closing the session deletes the node
	}
	select {
	case <-done:
		l.mu.Lock()
		defer l.mu.Unlock()
		return h.releaseErr
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// settleRelease records the outcome of the release's Delete of node.
func (l *Locker) settleRelease(node string, h *entry, err error) {
	switch {
	case err == nil:
	case errors.Is(err, zk.ErrNoNode), l.conn.SessionID() != h.session:
		err = lockkit.ErrNotHeld // its session expired, and the node with it
	default:
		l.bury(node)
		err = l.fail(err)
	}
	l.forget(node)
	l.mu.Lock()
	defer l.mu.Unlock()
	h.releasedOK = err == nil
	h.releaseErr = err
	close(h.released)
}

// expire gives the node back once its lease ran out. The node outlives the
// lease only if the session does, but then it would block the key for as
// long as this process lives.
func (l *Locker) expire(node string, h *entry) {
	l.mu.Lock()
	lost := h.lease.Lost()
	l.mu.Unlock()
	<-lost // closes at this same deadline: never free a node its holder still trusts
	l.forget(node)
	l.abandon(node)
}

func (l *Locker) forget(node string) {
	l.mu.Lock()
	delete(l.nodes, node)
	l.mu.Unlock()
}

// abandon deletes a node we no longer want. ref is its path or, when a
// lost reply left us without one, the path up to the sequence number. A
// deletion that fails, or takes longer than abandonWait, goes on in the
// background: a live session must never keep an orphan, which would block
// the key for as long as we live, and a caller who gave up must not wait
// for a half-open connection's timeout.
func (l *Locker) abandon(ref string) {
	done := make(chan bool, 1)
	if !l.background.Go(func() { done <- l.remove(ref) }) {
		return // closing the session deletes the node
	}
	timeout := time.NewTimer(abandonWait)
	defer timeout.Stop()
	select {
	case removed := <-done:
		if !removed {
			l.bury(ref)
		}
	case <-timeout.C:
		l.background.Go(func() {
			if !<-done {
				l.bury(ref)
			}
		})
	}
}

func (l *Locker) remove(ref string) bool {
	node := ref
	if strings.HasSuffix(ref, "-lock-") {
		var err error
		if node, err = l.find(ref); err != nil || node == "" {
			return err == nil
		}
	}
	err := l.conn.Delete(node, -1)
	return err == nil || errors.Is(err, zk.ErrNoNode)
}

// bury retries remove until it succeeds or the Locker closes; an expired
// session ends it too, as the node is then gone (ErrNoNode).
func (l *Locker) bury(ref string) {
	l.background.Go(func() {
		for {
			select {
			case <-l.background.Done():
				return
			case <-time.After(retryDelay):
			}
			if l.remove(ref) {
				return
			}
		}
	})
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

// dir is the key's node directory. Keys are path-escaped ('/' included);
// "", "." and "..", not valid as path elements, get encodings that
// PathEscape never produces.
func (l *Locker) dir(key string) string {
	e := url.PathEscape(key)
	switch e {
	case "":
		e = "%"
	case ".", "..":
		e = strings.ReplaceAll(e, ".", "%2E")
	}
	return l.root + "/" + e
}

// mkdirs creates dir and its parents as persistent nodes. A key's directory
// is deleted only when retired (see retireAt): deleting it whenever it
// empties would cost a request per release. The cost is one empty node per
// key ever locked.
func (l *Locker) mkdirs(dir string) error {
	for i := 1; i <= len(dir); i++ {
		if i == len(dir) || dir[i] == '/' {
			_, err := l.conn.Create(dir[:i], nil, 0, l.acl)
			if err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return l.fail(err)
			}
		}
	}
	return nil
}

// sequence is the number ZooKeeper appended to a node name.
func sequence(name string) (int64, bool) {
	i := strings.LastIndex(name, "-lock-")
	if !strings.HasPrefix(name, protected) || i < 0 {
		return 0, false
	}
	seq, err := strconv.ParseInt(name[i+len("-lock-"):], 10, 64)
	return seq, err == nil
}

// pastRetirement says whether a node named name was numbered at or past
// retireAt, or past the wrap: it must not queue (see retireAt).
func pastRetirement(name string) bool {
	seq, _ := sequence(name)
	return seq < 0 || seq >= retireAt
}

// predecessor returns the node queued just ahead of mine ("" when mine is
// first) and whether mine is still there. Negative numbers, past the wrap,
// are nodes about to leave a retired directory: never ahead of anyone.
func predecessor(children []string, mine string) (pred string, found bool) {
	seq, _ := sequence(mine)
	var best int64 = -1 << 63
	for _, c := range children {
		s, ok := sequence(c)
		switch {
		case c == mine:
			found = true
		case ok && s >= 0 && s < seq && s > best:
			pred, best = c, s
		}
	}
	return pred, found
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
