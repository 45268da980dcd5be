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
	"strconv"
	"strings"
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

// successor is a waiter queued just behind a key that may be ours.
type successor struct {
	key   string
	rev   int64
	after int64 // the create revision of the key it waits behind
	// releasing is set, under Locker.mu, when our release of that key
	// starts; the release then sends its verdict on handed, once: true
	// when its call deleted the key and found ours still queued.
	releasing bool
	handed    chan bool
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
		if resp.Succeeded {
			return l.grant(key, me, rev, s, o, watchdog), nil
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
		lease, err := l.queue(ctx, waitCtx, key, dir, me, rev, ahead, s, o, watchdog)
		if !errors.Is(err, errRequeue) {
			return lease, err
		}
		l.abandon(me, rev)
	}
}

// queue waits until no key older than ours is left in dir. first, if not
// nil, is the key just ahead of ours as our put found it, at revision rev.
func (l *Locker) queue(ctx, waitCtx context.Context, key, dir, me string, rev int64, first *mvccpb.KeyValue, s *session, o lockkit.Options, watchdog bool) (lockkit.Lease, error) {
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
			return l.grant(key, me, rev, s, o, watchdog), nil
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
			return l.grant(key, me, rev, s, o, watchdog), nil
		case errors.Is(err, errRequeue):
			return nil, err
		case err != nil:
			l.abandon(me, rev)
			return nil, l.fail(ctx, waitCtx, err)
		}
	}
}

// waitDelete returns when the key ahead of us, as read at revision rev,
// is deleted, or something else happened that calls for a fresh look.
// handed says our release of that key has handed the lock to us (next).
func (l *Locker) waitDelete(ctx context.Context, ahead *mvccpb.KeyValue, rev int64, next *successor, s *session) (handed bool, err error) {
	key := string(ahead.Key)
	next.after, next.handed = ahead.CreateRevision, make(chan bool, 1)
	l.mu.Lock()
	if other := l.next[key]; other == nil || other.rev < next.rev {
		// Two waiters behind one key: the earlier one's key is gone (the
		// later one read after it), and so is its claim to a hand-off.
		l.next[key] = next
	}
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		if l.next[key] == next {
			delete(l.next, key)
		}
		l.mu.Unlock()
	}()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	events := l.client.Watch(ctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	var verdictLate <-chan time.Time
	for {
		select {
		case handed := <-next.handed:
			return handed, nil
		case <-events: // a deletion, or the watch failed (compaction): look again
			// Unless our release deleted it: its reply, which often comes
			// just after this event, saves the look. A reply that is lost
			// or slow does not keep a free lock waiting.
			l.mu.Lock()
			releasing := next.releasing
			l.mu.Unlock()
			if releasing {
				events, verdictLate = nil, time.After(verdictWait)
				continue
			}
			return false, ctx.Err()
		case <-verdictLate:
			return false, ctx.Err()
		case <-s.lease.Lost():
			return false, errRequeue // our key cannot be trusted any more: requeue with a new session
		case <-ctx.Done():
			return false, ctx.Err()
		case <-l.closed:
			return false, lockkit.ErrClosed
		}
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
	if h.unsettled {
		l.mu.Unlock()
		return l.releaseAgain(ctx, me, rev)
	}
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
	deleted, err := l.handOff(ctx, me, rev)
	if err != nil {
		l.retire(me, h.session.id)
		l.bury(me, rev)
		l.mu.Lock()
		h.unsettled = true
		l.mu.Unlock()
		return fmt.Errorf("%w: etcd: %w", lockkit.ErrUnavailable, err)
	}
	l.unclaim(me)
	if !deleted {
		return lockkit.ErrNotHeld
	}
	return nil
}

// releaseAgain answers a release called again after one the store did not
// answer. The burial deletes the key in the background meanwhile, and the
// first delete may land late, so a key found gone was most likely freed by
// our own hand: that is not ErrNotHeld, which says another owner was found.
func (l *Locker) releaseAgain(ctx context.Context, me string, rev int64) error {
	if _, err := l.remove(ctx, me, rev); err != nil {
		return fmt.Errorf("%w: etcd: %w", lockkit.ErrUnavailable, err)
	}
	return nil
}

// handOff deletes our granted key me and, when a waiter of ours is queued
// just behind it, tells that waiter in the same call whether it now holds
// the lock, so that it need not read the queue again.
//
// The waiter read the queue at some revision R after its put (revision
// r): no key with a create revision between rev and r was left then, and
// none can come, as create revisions only rise. No key older than ours
// was left when ours was granted. So once this call deletes our key, at
// revision D, no key older than the waiter's is left, and if the same
// call finds the waiter's key with revision r, that key is first in line
// at D: what the waiter's own read would have shown, one round trip
// later. Whatever else deleted a key (a lease run out, a session revoked,
// an operator), the compare or the count says so, and the waiter reads
// the queue as before. Its fence is its create revision, as ever.
//
// It earns its place: with the waiter reading the queue again instead
// (concurrency.Mutex's way), lockbench's Contended run made 0.70× the
// cycles/s (0.47-0.90 per round) on one server and 0.85× (0.57-0.95) on 3
// members: medians of 15 interleaved A/B rounds (docs/backends-zk-etcd.md).
func (l *Locker) handOff(ctx context.Context, me string, rev int64) (deleted bool, err error) {
	l.mu.Lock()
	next := l.next[me]
	if next != nil && next.after == rev {
		next.releasing = true
	} else {
		next = nil
	}
	l.mu.Unlock()
	if next == nil {
		resp, err := l.client.Delete(ctx, me)
		if err != nil {
			return false, err
		}
		return resp.Deleted > 0, nil
	}
	handed := false
	defer func() { next.handed <- handed }() // buffered: the waiter may have left
	// The compare costs a read of one key, the waiter's, on this path
	// only; both branches delete.
	resp, err := l.client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(next.key), "=", next.rev)).
		Then(clientv3.OpDelete(me)).Else(clientv3.OpDelete(me)).Commit()
	if err != nil {
		return false, err
	}
	deleted = resp.Responses[0].GetResponseDeleteRange().Deleted > 0
	handed = deleted && resp.Succeeded
	return deleted, nil
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
// reply lost, then the name freed and the put landing late), or a key
// under a retired name, which nothing of ours wants: a put that landed
// after its sweep gave up, or a stray whose first removal failed.
func (l *Locker) strayOfOurs(key, dir string, s *session) bool {
	if !strings.HasPrefix(key, dir+fmt.Sprintf("%016x-", s.id)) {
		return false
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, retired := l.retired[key]
	return retired || !l.names[key]
}

// retire keeps the name me, of session id, from ever being claimed
// again, as a write bearing it may still be applied late. A new session
// brings new names: the old session's retired names are then dropped.
func (l *Locker) retire(me string, id clientv3.LeaseID) {
	l.mu.Lock()
	l.names[me], l.retired[me] = true, id
	l.mu.Unlock()
}

// free undoes retire once nothing of the name's can land late any more.
func (l *Locker) free(me string, id clientv3.LeaseID) {
	l.mu.Lock()
	if old, retired := l.retired[me]; retired && old == id {
		delete(l.retired, me)
		delete(l.names, me)
	}
	l.mu.Unlock()
}

func (l *Locker) unclaim(me string) {
	l.mu.Lock()
	if _, retired := l.retired[me]; !retired {
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

// sweep deletes whatever key bears the name me, of session id: our put
// under it had a reply lost or found a key of ours already there. Such a
// put may still land late, left queued and blocking the lock for as long
// as the session lives, so the name is retired (no acquisition of ours
// bears it again, and any key under it is unwanted) and looked for a few
// times more over callTimeout.
func (l *Locker) sweep(me string, id clientv3.LeaseID) {
	l.retire(me, id)
	l.background.Go(func() {
		deadline := time.Now().Add(callTimeout)
		// A delete whose reply was lost may land late and take a key of a
		// later claim of the name: the name is freed again only when every
		// delete of the sweep was answered. A put landing later still is a
		// stray (strayOfOurs) or, under a claimed name, keeps that key's
		// create revision and lease.
		answered := true
		for wait := retryDelay; ; wait *= 2 {
			ctx, cancel := context.WithTimeout(l.life, callTimeout)
			deleted, err := l.remove(ctx, me, 0)
			cancel()
			answered = answered && err == nil
			if deleted || err == nil && time.Now().After(deadline) {
				if answered {
					l.free(me, id)
				}
				return
			}
			select {
			case <-l.closed:
				return
			case <-time.After(min(wait, callTimeout)):
			}
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
	resp, err := l.client.Grant(clientv3.WithRequireLeader(ctx), int64(l.sessionTTL.Seconds()))
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
	for me, old := range l.retired {
		if old != id {
			delete(l.retired, me)
			delete(l.names, me)
		}
	}
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
