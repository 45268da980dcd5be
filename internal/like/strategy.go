package like

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
)

// counterTimeout bounds the counter write, which runs detached from the
// request: once the set has changed, the counter must follow.
const counterTimeout = 5 * time.Second

// countMarkerTTL is how long a counter move remembers it ran: longer than
// counterTimeout, within which every resend of it is sent. One marker per
// like or unlike lives this long: 152 bytes each (MEMORY USAGE), 4.5 MB
// at 1,000 likes a second.
const countMarkerTTL = 30 * time.Second

// spread is the lock strategy. Keys are spread the way a cluster wants
// them: an entity's set and its fence share the entity's slot,
// {<type>:<id>}; each owner's counter hashes on its own.
type spread struct {
	client redis.UniversalClient
	k      keys
	guard  *guard.Guard
	delay  time.Duration
	// beforeWrite, when set by a test, runs between the membership check
	// and the writes.
	beforeWrite func(ctx context.Context)
}

func (s *spread) likers(e Entity) string { return s.k.prefix + "{" + e.Ref.String() + "}:likers" }
func (s *spread) fence(e Entity) string  { return s.k.fence(e.Ref) }
func (s *spread) received(owner int64) string {
	return s.k.prefix + "received:" + strconv.FormatInt(owner, 10)
}
func (s *spread) owned(owner int64) string {
	return s.k.prefix + "owned:" + strconv.FormatInt(owner, 10)
}

// set is a read-modify-write across two slots: check the membership, write
// the set, move the counter by what the check found. The counter follows
// the check, not SADD's reply, on purpose: the check stands for whatever a
// real flow decides from what it read, and it is that decision the lock
// keeps true until the writes land. (For this exact rule, trusting SADD's
// reply would keep the counter right without a lock; docs/likes-orders.md
// says so.)
func (s *spread) set(ctx context.Context, e Entity, user int64, add bool) error {
	k := Key(e.Ref)
	return s.guard.Do(ctx, []lockkey.Key{k}, func(ctx context.Context, f guard.Fences) error {
		return s.setFenced(ctx, e, user, add, f.Of(k))
	})
}

// setFenced is set's critical section, run under the lease whose token is
// fence. The check claims the set for fence before it reads, and the write
// lands only while the set still carries fence: a stale holder cannot
// write between a newer holder's check and its write (the stores' claim
// before read).
func (s *spread) setFenced(ctx context.Context, e Entity, user int64, add bool, fence uint64) error {
	member, err := checkScript.Run(ctx, s.client, []string{s.likers(e), s.fence(e)}, user, fence).Int64()
	if err != nil {
		return fmt.Errorf("like: check %s: %w", e.Ref, err)
	}
	if member < 0 {
		return fmt.Errorf("%w: likes of %s, token %d", lockkit.ErrFenced, e.Ref, fence)
	}
	if (member == 1) == add {
		return nil
	}
	if err := guard.Work(ctx, s.delay); err != nil {
		return err
	}
	if s.beforeWrite != nil {
		s.beforeWrite(ctx)
	}
	if ctx.Err() != nil { // the lease was lost or the client left: write nothing
		return context.Cause(ctx)
	}
	op, delta := "rem", int64(-1)
	if add {
		op, delta = "add", 1
	}
	res, err := writeScript.Run(ctx, s.client, []string{s.likers(e), s.fence(e)}, user, op, fence).Int64()
	if err != nil {
		return fmt.Errorf("%w: write %s: %w", ErrOutcomeUnknown, e.Ref, err)
	}
	if res < 0 {
		return fmt.Errorf("%w: likes of %s, token %d", lockkit.ErrFenced, e.Ref, fence)
	}
	// The set has changed: the counter must follow even if the request
	// or the lease ends now, or the pair drifts for good. A crash right
	// here still drifts by one; only the hashtag strategy's single
	// script closes that gap, and the audit reports it.
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), counterTimeout)
	defer cancel()
	return s.count(wctx, e.Owner, delta)
}

// count moves owner's counter by delta once. go-redis sends a command
// again when its connection drops before the reply, though the command
// may have run; the change's marker makes the second run a no-op. A
// failure after every retry is an unknown outcome: the counter moved or
// not, and the audit's like_drift shows which.
func (s *spread) count(ctx context.Context, owner, delta int64) error {
	received := s.received(owner)
	marker := s.k.prefix + "counted:{" + received + "}:" + rand.Text()
	if err := countScript.Run(ctx, s.client, []string{received, marker}, delta, countMarkerTTL.Milliseconds()).Err(); err != nil {
		return fmt.Errorf("%w: count for owner %d: %w", ErrOutcomeUnknown, owner, err)
	}
	return nil
}

// drift reads one owner's counter and sets under the locks of all of the
// owner's entities (taken in sorted order), so that no like is half-way
// while it reads. With lockkit.None() it reads what is there.
func (s *spread) drift(ctx context.Context, owner int64, entities []Ref) (int64, error) {
	lockKeys := make([]lockkey.Key, len(entities))
	for i, r := range entities {
		lockKeys[i] = Key(r)
	}
	var drift int64
	err := s.guard.Hold(ctx, lockKeys, func(ctx context.Context) error {
		var counter *redis.StringCmd
		cards := make([]*redis.IntCmd, len(entities))
		// Each reply is checked on its own: Pipelined returns only the
		// first error, which is GET's redis.Nil when the owner has no
		// likes, and would hide a failed SCARD read as an empty set.
		_, _ = s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			counter = p.Get(ctx, s.received(owner))
			for i, r := range entities {
				cards[i] = p.SCard(ctx, s.likers(Entity{Ref: r, Owner: owner}))
			}
			return nil
		})
		var err error
		drift, err = counterValue(counter)
		if err != nil {
			return err
		}
		for i, c := range cards {
			n, err := c.Result()
			if err != nil {
				return fmt.Errorf("like: likers of %s: %w", entities[i], err)
			}
			drift -= n
		}
		return nil
	})
	return drift, err
}

func counterValue(cmd *redis.StringCmd) (int64, error) {
	n, err := cmd.Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	return n, err
}

// tagged is the hashtag strategy: every key of one owner is in the slot
// {owner:<id>}, so one script spans the set and the counter.
type tagged struct {
	client redis.UniversalClient
	k      keys
}

func (t *tagged) tag(owner int64) string {
	return t.k.prefix + "{owner:" + strconv.FormatInt(owner, 10) + "}:"
}
func (t *tagged) likers(e Entity) string      { return t.tag(e.Owner) + "likers:" + e.Ref.String() }
func (t *tagged) received(owner int64) string { return t.tag(owner) + "received" }
func (t *tagged) owned(owner int64) string    { return t.tag(owner) + "owned" }

func (t *tagged) set(ctx context.Context, e Entity, user int64, add bool) error {
	op := "rem"
	if add {
		op = "add"
	}
	if err := toggleScript.Run(ctx, t.client, []string{t.likers(e), t.received(e.Owner)}, user, op).Err(); err != nil {
		return fmt.Errorf("%w: %s %s: %w", ErrOutcomeUnknown, op, e.Ref, err)
	}
	return nil
}

func (t *tagged) drift(ctx context.Context, owner int64, entities []Ref) (int64, error) {
	ks := []string{t.received(owner)}
	for _, r := range entities {
		ks = append(ks, t.likers(Entity{Ref: r, Owner: owner}))
	}
	return driftScript.Run(ctx, t.client, ks).Int64()
}
