package redislock

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
)

// handover is a grant a release here made to the head of the line.
type handover struct {
	owner string // fresh, not the waiter's own: see handover.lua
	fence uint64
	sent  time.Time // when the releaser sent it, before the grant began
}

// handOver releases a plain lease of owner by granting the key to the
// head of the Locker's line, in the same script (handover.lua), while the
// line's run allows it (backend.Line.Offer's keep) or nobody elsewhere
// marked the key. A release that ends a run and finds the mark frees the
// key for all and publishes, and the head here yields (Line.Released):
// it races the waiters elsewhere on the message. handled is false if
// there is no head to hand to, or Redis refused the script, and the
// caller releases as usual.
// One round trip instead of two pays: in interleaved A/B rounds of
// BenchmarkContended/redis (14 rounds, ABBA), a build whose releases free
// the key and call Line.Released made a median 0.81 of the cycles/s per
// round on shop-redis and 0.86 on shop-redis-3-lockers-4-each
// (docs/backends-redis.md).
//
// Like a plain release it runs on the caller's context alone and does not
// hold Close up; a grant whose waiter left, or whose outcome is unknown,
// is freed (free).
func (l *Locker) handOver(ctx context.Context, ks keyset, owner string) (handled bool, err error) {
	// Fair waiters here wait their turn in Redis's queue: no hand-over
	// past them.
	if l.closing.Err() != nil || l.room.fairWaiting(ks) {
		return false, nil
	}
	head, keep := l.line.Offer(string(ks))
	if head == nil {
		return false, nil
	}
	// A TTL under a millisecond would be PX 0, which Redis refuses: such
	// a head asks Redis itself and learns so.
	if head.TTL() < time.Millisecond {
		l.line.HandOver(head, nil)
		return false, nil
	}
	to, sent := l.newOwner(), time.Now()
	// go-redis sends keep as "1" or "0".
	res, err := handOverScript.Run(ctx, l.client, []string{ks.lock(), ks.fence()}, owner, to, head.TTL().Milliseconds(), keep).Int64()
	switch {
	case err == nil && res > 0:
		if !l.line.HandOver(head, &handover{owner: to, fence: uint64(res), sent: sent}) {
			l.free(ks, to) // the waiter has left
		}
		return true, nil
	case err == nil && res < 0:
		l.line.HandOver(head, nil)
		l.line.Released(string(ks)) // the run is spent: the head yields
		return true, nil
	}
	l.line.HandOver(head, nil)
	// Wake the head here whatever the outcome, as a plain release does: it
	// may not have marked the key, knowing it held here, and a release
	// that failed sends no message.
	l.room.deliver(ks.channel(), "")
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
