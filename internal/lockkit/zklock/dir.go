package zklock

import (
	"context"
	"crypto/rand"
	"errors"
	"net/url"
	"path"
	"strconv"
	"strings"

	"github.com/go-zookeeper/zk"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// create makes our node in dir. If the reply is lost the node may exist
// all the same, held by our live session and blocking the key for ever:
// its GUID finds it again.
func (l *Locker) create(waitCtx context.Context, dir string) (string, error) {
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
			node, err := l.findOnceBack(waitCtx, prefix)
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

// findOnceBack is find asked again, within the caller's wait, while the
// connection is being re-established: the client fails a request queued
// meanwhile without sending it.
func (l *Locker) findOnceBack(waitCtx context.Context, prefix string) (string, error) {
	cuts := 0
	for {
		node, err := l.find(prefix)
		if !l.cutOff(waitCtx, err, &cuts) {
			return node, err
		}
	}
}

// find returns the node whose path starts with prefix (its GUID makes it
// unique), "" if there is none. It is asked after a lost reply, when the
// client may have reconnected to another member of the ensemble, which
// may not have applied our create yet: the sync makes that member catch
// up with the leader before it lists (a session's requests are served in
// order), or the listing could miss our node, and the node, ours, would
// block the key until the session ends.
func (l *Locker) find(prefix string) (string, error) {
	dir := path.Dir(prefix)
	if _, err := l.conn.Sync(dir); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return "", err
	}
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
