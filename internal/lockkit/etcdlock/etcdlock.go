// Package etcdlock is the etcd lockkit backend, the recipe of etcd's
// concurrency.Mutex: each acquisition puts a key under <prefix><key>/,
// attached to the Locker's session lease; the key with the lowest create
// revision holds the lock, and each waiter watches only the key just ahead
// of it. The fence is the key's create revision.
//
// It differs from concurrency.Mutex in three ways, for reasons given in
// docs/backends-zk-etcd.md: every acquisition has a key of its own (the
// Mutex names keys by session, so goroutines sharing a session share a
// grant); the session's Lost signal is measured from when keep-alives were
// sent, not received; and lease TTLs are kept by this client, which deletes
// the key when a lease runs out.
package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

const (
	// DefaultPrefix starts every lock key.
	DefaultPrefix = "/shop/locks/"
	// DefaultSessionTTL is how long a dead process's keys outlive it.
	DefaultSessionTTL = 10 * time.Second
	// retryDelay paces the deletion of keys we could not delete at once.
	retryDelay = 250 * time.Millisecond
	// callTimeout bounds calls made outside any caller's context.
	callTimeout = 5 * time.Second
)

// errRequeue means our key or our session went away while we waited: the
// acquisition queues again, at the back.
var errRequeue = errors.New("etcdlock: key or session gone while waiting")

// Option configures a Locker.
type Option func(*Locker)

// WithPrefix sets the prefix of lock keys (DefaultPrefix).
func WithPrefix(prefix string) Option { return func(l *Locker) { l.prefix = prefix } }

// WithSessionTTL sets the session lease's TTL, rounded up to whole seconds
// (DefaultSessionTTL). The server may raise it to its minimum (2 s with
// default settings).
func WithSessionTTL(ttl time.Duration) Option {
	return func(l *Locker) {
		if ttl > 0 {
			l.sessionTTL = time.Duration(math.Ceil(ttl.Seconds())) * time.Second
		}
	}
}

// Locker grants leases as keys attached to one session lease, like
// Curator's single shared session: when the session is lost, every lease of
// this Locker is lost with it.
type Locker struct {
	client     *clientv3.Client
	ownClient  bool
	prefix     string
	sessionTTL time.Duration
	// life ends with Close; closed is its Done channel. Deletions in the
	// background run under it: once the session is revoked, they are moot.
	life       context.Context
	stop       context.CancelFunc
	closed     <-chan struct{}
	once       sync.Once
	newSession chan struct{} // a one-slot semaphore: one session is made at a time
	// background runs deletions that Close waits for; once it is stopped,
	// nothing new starts, as revoking the session deletes every key of ours.
	// Close stops it under mu, where currentSession looks whether it is.
	background backend.Group
	watchers   sync.WaitGroup // one watchSession per session

	mu      sync.Mutex
	session *session
	held    map[*held]struct{}
	// names are our keys that may exist on the server; a name is free
	// again once its key is known gone, except a retired one (release).
	names   map[string]bool
	retired map[string]bool
}

type session struct {
	id    clientv3.LeaseID
	lease lockkit.Lease // renewed by lockkit's watchdog; its Lost is the session's
	lost  bool          // under Locker.mu: watchSession has taken its leases
}

type held struct {
	timer   *time.Timer // deletes the key once the lease has run out
	lease   lockkit.Lease
	session *session
	orphan  bool // under Locker.mu: its session was lost
}

// New connects to etcd at endpoints and opens a session. Close closes the
// client too.
func New(endpoints []string, opts ...Option) (*Locker, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: callTimeout})
	if err != nil {
		return nil, fmt.Errorf("%w: etcd: %w", lockkit.ErrUnavailable, err)
	}
	l, err := FromClient(c, opts...)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	l.ownClient = true
	return l, nil
}

// FromClient opens a session on c, which the caller keeps and closes.
func FromClient(c *clientv3.Client, opts ...Option) (*Locker, error) {
	life, stop := context.WithCancel(context.Background())
	l := &Locker{
		client: c, prefix: DefaultPrefix, sessionTTL: DefaultSessionTTL,
		life: life, stop: stop, closed: life.Done(), newSession: make(chan struct{}, 1),
		held: make(map[*held]struct{}), names: make(map[string]bool), retired: make(map[string]bool),
	}
	for _, o := range opts {
		o(l)
	}
	ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
	defer cancel()
	if _, err := l.currentSession(ctx); err != nil {
		_ = l.Close()
		return nil, fmt.Errorf("%w: etcd: %w", lockkit.ErrUnavailable, err)
	}
	return l, nil
}

// Capabilities of the etcd backend.
func (l *Locker) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{Fencing: true, WaitNoPoll: true, Fair: true, LostSignal: true,
		Expires: true, OwnerCheck: true, CrossProcess: true}
}

// Acquire queues for key and waits until every key ahead of ours is gone.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return l.acquire(ctx, key, opts, true)
}

// TryAcquire queues for key and, if a key is ahead of ours, deletes ours
// and returns ErrNotAcquired.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return l.acquire(ctx, key, opts, false)
}

func (l *Locker) acquire(ctx context.Context, key string, opts []lockkit.Option, wait bool) (lockkit.Lease, error) {
	o, watchdog := backend.Resolve(opts)
	waitCtx, cancel := backend.WaitContext(ctx, o)
	defer cancel()
	// Escaped, so that no key's directory is a prefix of another's.
	dir := l.prefix + url.PathEscape(key) + "/"
	for {
		if backend.IsClosed(l.closed) {
			return nil, lockkit.ErrClosed
		}
		s, err := l.currentSession(waitCtx)
		if err != nil {
			return nil, l.fail(ctx, waitCtx, err)
		}
		me := l.claim(dir, s.id)
		// An empty dir means our key is the oldest, so the free lock costs
		// one compare and the put: nothing is read back (the Mutex reads
		// the oldest key to compare revisions). Otherwise we queue; the
		// previous value tells whether our own name was there.
		resp, err := l.client.Txn(waitCtx).If(clientv3.Compare(clientv3.CreateRevision(dir), "=", 0).WithPrefix()).Then(
			clientv3.OpPut(me, "", clientv3.WithLease(s.id)),
		).Else(
			clientv3.OpPut(me, "", clientv3.WithLease(s.id), clientv3.WithPrevKV()),
		).Commit()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			l.unclaim(me)
			_ = s.lease.Release(waitCtx) // expired before our watchdog knew: retire it
			continue
		case err != nil:
			l.abandon(me, 0) // the put may have been applied, its reply lost
			return nil, l.fail(ctx, waitCtx, err)
		}
		// One revision per txn: it is our key's create revision.
		rev := resp.Header.Revision
		if resp.Succeeded {
			return l.grant(key, me, rev, s, o, watchdog), nil
		}
		if resp.Responses[0].GetResponsePut().PrevKv != nil {
			// A key we thought deleted: the put kept its older create
			// revision, and we must never queue behind ourselves.
			l.abandon(me, 0)
			continue
		}
		if !wait {
			// Deleted before returning, not in the background: left queued,
			// the key would sit ahead of this caller's next TryAcquire and
			// have it refused a free lock.
			if _, err := l.remove(waitCtx, me, rev); err != nil {
				l.abandon(me, rev)
			}
			return nil, lockkit.ErrNotAcquired
		}
		lease, err := l.queue(ctx, waitCtx, key, dir, me, rev, s, o, watchdog)
		if !errors.Is(err, errRequeue) {
			return lease, err
		}
		l.abandon(me, rev)
	}
}

// queue waits until no key older than ours is left in dir.
func (l *Locker) queue(ctx, waitCtx context.Context, key, dir, me string, rev int64, s *session, o lockkit.Options, watchdog bool) (lockkit.Lease, error) {
	for {
		// One read says whether our key is still there and who is just
		// ahead of us. Both matter: a waiter that only waited for the keys
		// ahead returned as the holder after its own key had gone with an
		// expired lease (etcd issue 11456, Jepsen 2020).
		resp, err := l.client.Txn(waitCtx).Then(
			clientv3.OpGet(me),
			clientv3.OpGet(dir, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))...),
		).Commit()
		if err != nil {
			l.abandon(me, rev)
			return nil, l.fail(ctx, waitCtx, err)
		}
		mine, ahead := resp.Responses[0].GetResponseRange().Kvs, resp.Responses[1].GetResponseRange().Kvs
		switch {
		case len(mine) == 0:
			return nil, errRequeue
		case len(ahead) == 0:
			return l.grant(key, me, rev, s, o, watchdog), nil
		case l.strayOfOurs(string(ahead[0].Key), dir, s):
			// Nothing here would ever delete it while the session lives.
			if _, err := l.remove(waitCtx, string(ahead[0].Key), ahead[0].CreateRevision); err != nil {
				l.abandon(me, rev)
				return nil, l.fail(ctx, waitCtx, err)
			}
			continue
		}
		if err := l.waitDelete(waitCtx, string(ahead[0].Key), resp.Header.Revision, s); err != nil {
			if !errors.Is(err, errRequeue) {
				l.abandon(me, rev)
				err = l.fail(ctx, waitCtx, err)
			}
			return nil, err
		}
	}
}

// waitDelete returns when key is deleted after revision rev, or something
// else happened that calls for a fresh look.
func (l *Locker) waitDelete(ctx context.Context, key string, rev int64, s *session) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := l.client.Watch(ctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	select {
	case <-events: // a deletion, or the watch failed (compaction): look again
		return ctx.Err()
	case <-s.lease.Lost():
		return errRequeue // our key cannot be trusted any more: requeue with a new session
	case <-ctx.Done():
		return ctx.Err()
	case <-l.closed:
		return lockkit.ErrClosed
	}
}

// grant hands the lease no Gone channel, which would cost a goroutine per
// lease: watchSession ends it if the session is lost.
func (l *Locker) grant(key, me string, rev int64, s *session, o lockkit.Options, watchdog bool) lockkit.Lease {
	h := &held{session: s}
	sent := time.Now()
	l.mu.Lock()
	// Under mu: expire and extend must see both the timer and the lease.
	h.timer = time.AfterFunc(time.Until(sent.Add(o.TTL)), func() { l.expire(me, rev, h) })
	h.lease = backend.NewLease(backend.Grant{
		Key: key, Fence: uint64(rev), TTL: o.TTL, Watchdog: watchdog, Sent: sent,
		Extend:  func(ctx context.Context, ttl time.Duration) error { return l.extend(ctx, me, rev, h, ttl) },
		Release: func(ctx context.Context) error { return l.release(ctx, me, rev, h) },
		Closed:  l.closed,
	})
	l.held[h] = struct{}{}
	h.orphan = s.lost // lost since the put: born lost
	l.mu.Unlock()
	if h.orphan {
		_ = h.lease.Release(context.Background())
	}
	return h.lease
}

// watchSession ends the leases of s once s is lost: their keys cannot be
// trusted any more. Release closes each one's Lost at once and, as the
// lease is an orphan, lets its key go in the background.
func (l *Locker) watchSession(s *session) {
	<-s.lease.Lost()
	var orphans []*held
	l.mu.Lock()
	s.lost = true
	for h := range l.held {
		if h.session == s {
			h.orphan = true
			orphans = append(orphans, h)
		}
	}
	l.mu.Unlock()
	for _, h := range orphans {
		_ = h.lease.Release(context.Background())
	}
}

// extend checks the key is still ours and moves its deletion to ttl from
// now; the session lease keeps the key on the server meanwhile.
func (l *Locker) extend(ctx context.Context, me string, rev int64, h *held, ttl time.Duration) error {
	sent := time.Now()
	resp, err := l.client.Get(ctx, me) // linearizable: a stale read could miss a deletion
	if err != nil {
		return fmt.Errorf("%w: etcd: %w", lockkit.ErrUnavailable, err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != rev {
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

func (l *Locker) release(ctx context.Context, me string, rev int64, h *held) error {
	l.mu.Lock()
	delete(l.held, h)
	expired := !h.timer.Stop()
	orphan := h.orphan
	l.mu.Unlock()
	switch {
	case expired:
		return lockkit.ErrNotHeld
	case orphan:
		// The server may keep the key until the session's lease runs out
		// there; nobody trusts it now, so it may go at once.
		l.abandon(me, rev)
		return lockkit.ErrNotHeld
	}
	// A plain delete, as the Mutex's, is owner-checked too: the name holds
	// our session's lease id, and no other key of ours bears it while this
	// delete may still be applied. A compare would cost the server a read
	// of the key on the common path. A delete whose outcome is unknown may
	// be applied late (a proposal forwarded by another member), after its
	// key is gone: the name is retired then, never claimed again (a new
	// session brings new names), so that it cannot delete a later grant.
	resp, err := l.client.Delete(ctx, me)
	if err != nil {
		l.mu.Lock()
		l.retired[me] = true
		l.mu.Unlock()
		l.bury(me, rev)
		return fmt.Errorf("%w: etcd: %w", lockkit.ErrUnavailable, err)
	}
	l.unclaim(me)
	if resp.Deleted == 0 {
		return lockkit.ErrNotHeld
	}
	return nil
}

// expire gives the key back once its lease ran out. The key outlives the
// lease only if the session does, but then it would block the lock for as
// long as this process lives.
func (l *Locker) expire(me string, rev int64, h *held) {
	l.mu.Lock()
	delete(l.held, h)
	lost := h.lease.Lost()
	l.mu.Unlock()
	<-lost // closes at this same deadline: never free a key its holder still trusts
	l.abandon(me, rev)
}

// claim returns a key name for a new acquisition in dir: the session and
// the lowest number none of our keys there has. Names are reused, since
// each name ever deleted stays in etcd's index until compaction, and the
// sorted range every acquisition makes walks them all.
func (l *Locker) claim(dir string, id clientv3.LeaseID) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	buf := make([]byte, 0, len(dir)+24)
	buf = append(buf, dir...)
	buf = fmt.Appendf(buf, "%016x-", id)
	for i := uint64(0); ; i++ {
		if me := string(strconv.AppendUint(buf, i, 10)); !l.names[me] {
			l.names[me] = true
			return me
		}
	}
}

// strayOfOurs reports whether key, in dir, bears a name of session s that
// no acquisition here claims: a put applied after we gave its name up (a
// reply lost, then the name freed and the put landing late).
func (l *Locker) strayOfOurs(key, dir string, s *session) bool {
	if !strings.HasPrefix(key, dir+fmt.Sprintf("%016x-", s.id)) {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return !l.names[key]
}

func (l *Locker) unclaim(me string) {
	l.mu.Lock()
	if !l.retired[me] {
		delete(l.names, me)
	}
	l.mu.Unlock()
}

// remove deletes our key if it is still the grant of revision rev (rev 0:
// any). The name alone would do while it stays claimed (see release); off
// the common path, the compare also guards against bookkeeping we got
// wrong. Once the key is known gone, its name is free again.
func (l *Locker) remove(ctx context.Context, me string, rev int64) (deleted bool, err error) {
	cmp := clientv3.Compare(clientv3.CreateRevision(me), "=", rev)
	if rev == 0 {
		cmp = clientv3.Compare(clientv3.CreateRevision(me), ">", 0)
	}
	resp, err := l.client.Txn(ctx).If(cmp).Then(clientv3.OpDelete(me)).Commit()
	if err != nil {
		return false, err
	}
	l.unclaim(me)
	return resp.Succeeded, nil
}

// abandon deletes a key we no longer want, in the background: the caller
// (often one whose context just ended, perhaps on a silent server) returns
// at once. A failed deletion is retried, so that a live session never
// keeps an orphan. A caller that queues again need not wait for it either:
// it gets a new name, and a stale key ahead of it is deleted in time.
func (l *Locker) abandon(me string, rev int64) {
	l.background.Go(func() {
		ctx, cancel := context.WithTimeout(l.life, callTimeout)
		defer cancel()
		if _, err := l.remove(ctx, me, rev); err != nil {
			l.bury(me, rev)
		}
	})
}

// bury retries the deletion until it is done or the Locker closes; a lost
// session ends it too, as the key is then gone.
func (l *Locker) bury(me string, rev int64) {
	l.background.Go(func() {
		for {
			select {
			case <-l.closed:
				return
			case <-time.After(retryDelay):
			}
			ctx, cancel := context.WithTimeout(l.life, callTimeout)
			_, err := l.remove(ctx, me, rev)
			cancel()
			if err == nil {
				return
			}
		}
	})
}

// currentSession returns the live session, opening one if there is none.
func (l *Locker) currentSession(ctx context.Context) (*session, error) {
	if s := l.liveSession(); s != nil {
		return s, nil
	}
	select {
	case l.newSession <- struct{}{}:
		defer func() { <-l.newSession }()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if s := l.liveSession(); s != nil {
		return s, nil // another caller opened it while we waited
	}
	sent := time.Now()
	resp, err := l.client.Grant(ctx, int64(l.sessionTTL.Seconds()))
	if err != nil {
		return nil, err
	}
	id := resp.ID
	// lockkit's watchdog renews the session every TTL/3 and closes Lost at
	// send time + TTL of the last renewal the server answered: never after
	// the server expires the lease. (concurrency.Session counts from the
	// reply's arrival and checks once a second: up to a second late.)
	s := &session{id: id, lease: backend.NewLease(backend.Grant{
		Key: "session", TTL: l.sessionTTL, Watchdog: true, Sent: sent,
		Extend: func(ctx context.Context, _ time.Duration) error {
			resp, err := l.client.KeepAliveOnce(ctx, id)
			if errors.Is(err, rpctypes.ErrLeaseNotFound) || err == nil && resp.TTL <= 0 {
				return lockkit.ErrNotHeld
			}
			return err
		},
		Release: func(ctx context.Context) error {
			_, err := l.client.Revoke(ctx, id)
			return err
		},
		Closed: l.closed,
	})}
	l.mu.Lock()
	defer l.mu.Unlock()
	if backend.IsClosed(l.background.Done()) {
		_ = s.lease.Release(ctx)
		return nil, lockkit.ErrClosed
	}
	l.session = s
	l.watchers.Go(func() { l.watchSession(s) })
	return s, nil
}

func (l *Locker) liveSession() *session {
	l.mu.Lock()
	s := l.session
	l.mu.Unlock()
	if s != nil && !backend.IsClosed(s.lease.Lost()) {
		return s
	}
	return nil
}

// Close revokes the session, which deletes every key this Locker still
// has: unlike stores with server-side TTLs, held keys are freed at once.
func (l *Locker) Close() error {
	var err error
	l.once.Do(func() {
		l.mu.Lock()
		l.background.Stop()
		for h := range l.held {
			h.timer.Stop()
		}
		s := l.session
		l.mu.Unlock()
		l.stop()
		l.background.Wait()
		if s != nil {
			ctx, cancel := context.WithTimeout(context.Background(), callTimeout)
			_ = s.lease.Release(ctx)
			cancel()
		}
		// Every session is lost by now, the last one just above: their
		// watchers have closed the Lost of every lease still held.
		l.watchers.Wait()
		if l.ownClient {
			err = l.client.Close()
		}
	})
	return err
}

// fail maps an error of a call made under waitCtx to lockkit's.
func (l *Locker) fail(ctx, waitCtx context.Context, err error) error {
	switch {
	case backend.IsClosed(l.closed):
		return lockkit.ErrClosed
	case errors.Is(err, lockkit.ErrClosed):
		return err
	case waitCtx.Err() != nil:
		return backend.WaitErr(ctx, waitCtx)
	}
	return fmt.Errorf("%w: etcd: %w", lockkit.ErrUnavailable, err)
}
