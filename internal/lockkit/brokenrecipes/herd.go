package brokenrecipes

import (
	"context"
	"errors"
	"net/url"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// UNSAFE for a crowd: ParentWatch is ZooKeeper's lock recipe with the herd
// effect its documentation warns about. Each waiter queues an ephemeral
// sequential node, as the recipe says, but waits with a watch on the lock's
// directory (getChildren with the watch flag) instead of on the node just
// ahead of it. Every change of the queue, a release or a newcomer, then
// wakes every waiter, and each lists the whole queue again to find that,
// all but one, it is still not first. Exclusion and order hold; what a
// release costs the server grows with the number of waiters
// (lockbench's BenchmarkHerd counts it).
type ParentWatch struct {
	closer
	conn *zk.Conn
	root string
	// waiting, if set, runs each time a waiter has armed its watch on the
	// directory and is about to wait: the tests count armed waiters there.
	waiting func()
}

// UNSAFE: NewParentWatch returns the herd recipe over conn, with the key
// directories under root.
func NewParentWatch(conn *zk.Conn, root string) *ParentWatch {
	return &ParentWatch{closer: newCloser(), conn: conn, root: strings.TrimSuffix(root, "/")}
}

// UNSAFE: Capabilities are the recipe's: the node dies with the session,
// and the lease's TTL is kept by the client alone.
func (p *ParentWatch) Capabilities() lockkit.Capabilities {
	return lockkit.Capabilities{WaitNoPoll: true, Fair: true, Expires: true, OwnerCheck: true, CrossProcess: true}
}

// UNSAFE: Acquire queues a node and wakes at every change of the queue
// until the node is first.
func (p *ParentWatch) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, watchdog := backend.Resolve(opts)
	wait, cancel := backend.WaitContext(ctx, o)
	defer cancel()
	sent := time.Now()
	dir, node, err := p.enqueue(key)
	if err != nil {
		return nil, err
	}
	for {
		children, _, changed, err := p.conn.ChildrenW(dir)
		if err != nil {
			p.dequeue(node)
			return nil, unavailable(err)
		}
		if first(children, node) {
			return p.lease(key, node, o.TTL, watchdog, sent), nil
		}
		if p.waiting != nil {
			p.waiting()
		}
		select {
		case <-changed: // any change of the directory: list it all again
		case <-wait.Done():
			p.dequeue(node)
			return nil, backend.WaitErr(ctx, wait)
		case <-p.closed:
			p.dequeue(node)
			return nil, lockkit.ErrClosed
		}
	}
}

// UNSAFE: TryAcquire queues a node and keeps it only if it is first.
func (p *ParentWatch) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	o, watchdog := backend.Resolve(opts)
	sent := time.Now()
	dir, node, err := p.enqueue(key)
	if err != nil {
		return nil, err
	}
	children, _, err := p.conn.Children(dir)
	if err != nil || !first(children, node) {
		p.dequeue(node)
		if err != nil {
			return nil, unavailable(err)
		}
		return nil, lockkit.ErrNotAcquired
	}
	return p.lease(key, node, o.TTL, watchdog, sent), nil
}

// enqueue creates key's ephemeral sequential node, and the directories
// above it the first time.
func (p *ParentWatch) enqueue(key string) (dir, node string, err error) {
	select {
	case <-p.closed:
		return "", "", lockkit.ErrClosed
	default:
	}
	dir = p.root + "/" + url.PathEscape(key)
	acl := zk.WorldACL(zk.PermAll)
	for range 2 {
		node, err = p.conn.Create(dir+"/lock-", nil, zk.FlagEphemeral|zk.FlagSequence, acl)
		if !errors.Is(err, zk.ErrNoNode) {
			break
		}
		parts := strings.Split(strings.TrimPrefix(dir, "/"), "/")
		for i := range parts {
			d := "/" + strings.Join(parts[:i+1], "/")
			if _, err := p.conn.Create(d, nil, 0, acl); err != nil && !errors.Is(err, zk.ErrNodeExists) {
				return "", "", unavailable(err)
			}
		}
	}
	if err != nil {
		return "", "", unavailable(err)
	}
	return dir, node, nil
}

func (p *ParentWatch) dequeue(node string) { _ = p.conn.Delete(node, -1) }

// first reports whether node has the lowest sequence number of children:
// the names differ only in their ten-digit sequence.
func first(children []string, node string) bool {
	return len(children) > 0 && slices.Min(children) == path.Base(node)
}

func (p *ParentWatch) lease(key, node string, ttl time.Duration, watchdog bool, sent time.Time) lockkit.Lease {
	return backend.NewLease(backend.Grant{
		Key: key, TTL: ttl, Watchdog: watchdog, Sent: sent,
		Extend: func(context.Context, time.Duration) error {
			ok, _, err := p.conn.Exists(node)
			switch {
			case err != nil:
				return unavailable(err)
			case !ok:
				return lockkit.ErrNotHeld
			}
			return nil
		},
		Release: func(context.Context) error {
			err := p.conn.Delete(node, -1)
			switch {
			case errors.Is(err, zk.ErrNoNode):
				return lockkit.ErrNotHeld
			case err != nil:
				return unavailable(err)
			}
			return nil
		},
		Closed: p.closed,
	})
}
