package redislock

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
)

// yieldWake is how late a release that freed a marked key for the waiters
// elsewhere wakes the head here, should the release message not reach
// it: long after a waiter elsewhere has heard the message and asked.
const yieldWake = 20 * time.Millisecond

// handOver releases a plain lease of owner by granting the key to the
// plain waiter at the head here, in the same script, unless a waiter
// marked the key and the run of hand-overs here has reached
// backend.HandOffRun (handover.lua); handled is false if there is no such
// waiter, or Redis refused the script, and the caller releases as usual.
// One round trip instead of two pays: in interleaved A/B rounds of
// BenchmarkContended/redis/shop-redis, a build without hand-overs made a
// median 0.87 of the cycles/s per round (docs/backends-redis.md).
//
// The run is what a process with waiters of its own gains from a hand-over
// in one call while others wait too. Without it every release with a
// waiter elsewhere freed the key, and its waiters in every process raced
// for it, a release, a message and an acquire later.
// Like a plain release it runs on the caller's context alone and does not
// hold Close up; a grant whose waiter left, or whose outcome is unknown,
// is freed (free).
func (l *Locker) handOver(ctx context.Context, ks keyset, owner string) (handled bool, err error) {
	w, keep := l.room.offer(ks)
	if w == nil {
		return false, nil
	}
	to, sent := l.newOwner(), time.Now()
	// go-redis sends keep as "1" or "0".
	res, err := handOverScript.Run(ctx, l.client, []string{ks.lock(), ks.fence()}, owner, to, w.ttl.Milliseconds(), keep).Int64()
	switch {
	case err == nil && res > 0:
		l.room.handedOver(ks)
		if !l.room.settle(w, &handover{ks: ks, owner: to, fence: uint64(res), sent: sent}) {
			l.free(ks, to) // the waiter has left
		}
		return true, nil
	case err == nil && res < 0:
		// Freed for the waiters elsewhere, and all were told, the head
		// here too: it races them on the same message, not ahead of it,
		// or it would win nearly every time and start the next run. It
		// is woken here as well, late, in case the message does not come
		// (a stalled subscription): it may not have marked the key,
		// knowing it held here.
		l.room.settle(w, nil)
		l.room.freed(ks)
		time.AfterFunc(yieldWake, func() { l.room.wakeIfHead(w) })
		return true, nil
	}
	l.room.settle(w, nil)
	// Wake the head here whatever the outcome, as a plain release does: it
	// may not have marked the key, knowing it held here, and a release
	// that failed sends no message.
	l.room.wake(ks, "")
	return l.handOverFailed(ctx, ks, to, err)
}

// handOverFailed answers a hand-over to owner to that granted nothing:
// the lease was not ours (err nil), Redis refused the script, or its
// outcome is unknown.
func (l *Locker) handOverFailed(ctx context.Context, ks keyset, to string, err error) (handled bool, _ error) {
	var replyErr redis.Error
	switch {
	case err == nil:
		return true, lockkit.ErrNotHeld
	case errors.As(err, &replyErr) && !isLoading(replyErr):
		// Redis refused the script (a write refused under maxmemory, say):
		// free the key as a plain release does, and the grant, should the
		// script have got that far.
		l.free(ks, to)
		return false, nil
	}
	l.free(ks, to) // the key may have been handed over all the same
	return true, unavailable(ctx, err)
}
