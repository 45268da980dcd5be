// Package etcdlock is the etcd lockkit backend, the recipe of etcd's
// concurrency.Mutex: each acquisition puts a key under <prefix><key>/,
// attached to the Locker's session lease; the key with the lowest create
// revision holds the lock, and each waiter watches only the key just ahead
// of it. The fence is the key's create revision.
//
// A waiter reads the queue again once the key ahead of it is gone, to see
// that its own key is still there and first. When that key was this
// Locker's and was released here, the release's own call does the looking
// instead (see handOff), and the waiter is granted on its reply.
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
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
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
	// verdictWait bounds how long a waiter, once its predecessor is gone,
	// waits for the reply of our release that deleted it (see handOff)
	// before it reads the queue itself.
	verdictWait = 100 * time.Millisecond
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
	retired map[string]clientv3.LeaseID
	// next holds, by the name of the key it waits behind, each waiter of
	// ours that a release may hand the lock to (see handOff).
	next map[string]*successor
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
	// unsettled, under Locker.mu: a release was sent and not answered, so
	// a release called again asks the store once more.
	unsettled bool
}

// New connects to etcd at endpoints and opens a session. Close closes the
// client too.
func New(endpoints []string, opts ...Option) (*Locker, error) {
	c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: callTimeout, Logger: slogLogger()})
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
		held: make(map[*held]struct{}), names: make(map[string]bool), retired: make(map[string]clientv3.LeaseID),
		next: make(map[string]*successor),
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
		if waitCtx.Err() != nil {
			// Before the put, not after it: a put sent and then cut
			// short may still land, and its name must be swept.
			return nil, l.fail(ctx, waitCtx, waitCtx.Err())
		}
		me := l.claim(dir, s.id)
		// An empty dir means our key is the oldest, so the free lock costs
		// one compare and the put: nothing is read back (the Mutex reads
		// the oldest key to compare revisions). Otherwise we queue; the
		// previous value tells whether our own name was there, and the
		// two newest keys, read after the put, are ours and the one just
		// ahead of it: the waiter need not read the queue before waiting.
		// WithRequireLeader: a member that knows it has no quorum says
		// so at once (ErrUnavailable), where the put would otherwise wait
		// out the caller's deadline as if the key were held.
		resp, err := l.client.Txn(clientv3.WithRequireLeader(waitCtx)).If(clientv3.Compare(clientv3.CreateRevision(dir), "=", 0).WithPrefix()).Then(
			clientv3.OpPut(me, "", clientv3.WithLease(s.id)),
		).Else(
			clientv3.OpPut(me, "", clientv3.WithLease(s.id), clientv3.WithPrevKV()),
			clientv3.OpGet(dir, append(clientv3.WithLastCreate(), clientv3.WithLimit(2))...),
		).Commit()
		switch {
		case errors.Is(err, rpctypes.ErrLeaseNotFound):
			l.unclaim(me)
			_ = s.lease.Release(waitCtx) // expired before our watchdog knew: retire it
			continue
		case err != nil:
			l.sweep(me, s.id) // the put may have been applied, its reply lost
			return nil, l.fail(ctx, waitCtx, err)
		}
		// One revision per txn: it is our key's create revision.
		rev := resp.Header.Revision
		t := ticket{key: key, dir: dir, me: me, rev: rev, s: s, o: o, watchdog: watchdog}
		if resp.Succeeded {
			return l.grant(t), nil
		}
		if resp.Responses[0].GetResponsePut().PrevKv != nil {
			// A key we thought deleted: the put kept its older create
			// revision, and we must never queue behind ourselves.
			l.sweep(me, s.id)
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
		var ahead *mvccpb.KeyValue
		if newest := resp.Responses[1].GetResponseRange().Kvs; len(newest) == 2 && newest[0].CreateRevision == rev {
			ahead = newest[1]
		}
		lease, err := l.queue(ctx, waitCtx, t, ahead)
		if !errors.Is(err, errRequeue) {
			return lease, err
		}
		l.abandon(me, rev)
	}
}

// ticket is one acquisition's key in the queue of key's directory dir:
// me, created at revision rev in session s.
type ticket struct {
	key, dir, me string
	rev          int64
	s            *session
	o            lockkit.Options
	watchdog     bool
}

// queue waits until no key older than t's is left in its dir. first, if
// not nil, is the key just ahead of t's as its put found it.
func (l *Locker) queue(ctx, waitCtx context.Context, t ticket, first *mvccpb.KeyValue) (lockkit.Lease, error) {
	dir, me, rev, s := t.dir, t.me, t.rev, t.s
	for {
		mine, foreign, ahead, readRev := true, false, []*mvccpb.KeyValue{first}, rev
		if first == nil {
			// One read says whether our key is still there and who is just
			// ahead of us. Both matter: a waiter that only waited for the
			// keys ahead returned as the holder after its own key had gone
			// with an expired lease (etcd issue 11456, Jepsen 2020).
			resp, err := l.client.Txn(waitCtx).Then(
				clientv3.OpGet(me),
				clientv3.OpGet(dir, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(rev-1))...),
			).Commit()
			if err != nil {
				l.abandon(me, rev)
				return nil, l.fail(ctx, waitCtx, err)
			}
			// By its create revision, not its name alone: a key put under
			// the same name since would pass for ours.
			own := resp.Responses[0].GetResponseRange().Kvs
			mine = len(own) == 1 && own[0].CreateRevision == rev
			foreign = len(own) == 1 && !mine
			ahead, readRev = resp.Responses[1].GetResponseRange().Kvs, resp.Header.Revision
		}
		first = nil
		switch {
		case !mine:
			if foreign {
				// Junk under our name, which a compare on our revision
				// would leave behind, queued ahead of our next key.
				l.sweep(me, s.id)
			}
			return nil, errRequeue
		case len(ahead) == 0:
			return l.grant(t), nil
		case l.strayOfOurs(string(ahead[0].Key), dir, s):
			// Nothing here would ever delete it while the session lives.
			// Its name is retired first: an acquisition claiming it
			// meanwhile would have its claim undone by the removal.
			l.retire(string(ahead[0].Key), s.id)
			if _, err := l.remove(waitCtx, string(ahead[0].Key), ahead[0].CreateRevision); err != nil {
				l.abandon(me, rev)
				return nil, l.fail(ctx, waitCtx, err)
			}
			continue
		}
		handed, err := l.waitDelete(waitCtx, ahead[0], readRev, &successor{key: me, rev: rev}, s)
		switch {
		case handed:
			return l.grant(t), nil
		case errors.Is(err, errRequeue):
			return nil, err
		case err != nil:
			l.abandon(me, rev)
			return nil, l.fail(ctx, waitCtx, err)
		}
	}
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
