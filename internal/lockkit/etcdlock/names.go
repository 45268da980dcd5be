package etcdlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

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
