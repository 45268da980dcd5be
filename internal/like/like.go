// Package like counts likes on a Redis Cluster: who likes an entity (a set
// per entity) and how many likes each owner received (a counter per owner).
//
// The two live in different hash slots, so no MULTI and no script can span
// them. Two strategies keep them consistent, chosen by Options.Strategy:
//
//   - lock (default): the keys are spread by entity and by owner. A like
//     checks membership, writes the set and moves the owner's counter under
//     lock:like:<type>:<id>. With lockkit.None() and a critical-section delay
//     this is the unsafe baseline that drifts.
//   - hashtag: every key of one owner carries the hash tag {owner:<id>}, so
//     one Lua script does check, write and count atomically, without a lock.
//     It fits when all of an owner's data may live on one node (a popular
//     owner then makes a hot slot) and when likes never move between owners.
//
// Entities are registered with their owner (POST /admin/v1/entities); the
// owner never changes, which is what lets the hashtag strategy locate an
// entity's set from the entity alone.
package like

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkey"
)

// Errors of the like domain, mapped to statuses in http.go.
var (
	// ErrEntityNotFound: no entity of this type and id was registered.
	ErrEntityNotFound = errors.New("entity not found")
	// ErrOwnerConflict: the entity is registered with another owner. Owners
	// never change: the received counters would have to move with them.
	ErrOwnerConflict = errors.New("entity registered with another owner")
	// ErrInvalidEntity: a type, id or owner id that is not well-formed.
	ErrInvalidEntity = errors.New("invalid entity")
	// ErrOutcomeUnknown: a write of the like or unlike was sent and no
	// reply came, resends included: the liker set and the owner's counter
	// may or may not show it. Sending the change again is safe (it is
	// idempotent per user); the audit's like_drift shows whether the pair
	// still agrees.
	ErrOutcomeUnknown = errors.New("the like's outcome is unknown")
)

var (
	//go:embed check.lua
	checkLua string
	//go:embed write.lua
	writeLua string
	//go:embed toggle.lua
	toggleLua string
	//go:embed drift.lua
	driftLua string
	//go:embed count.lua
	countLua string

	checkScript  = redis.NewScript(checkLua)
	writeScript  = redis.NewScript(writeLua)
	toggleScript = redis.NewScript(toggleLua)
	driftScript  = redis.NewScript(driftLua)
	countScript  = redis.NewScript(countLua)
)

// Types and ids become parts of Redis keys: no ':' and no braces, which
// would change the key layout or its hash tag.
var (
	typePattern = regexp.MustCompile(`^[a-z][a-z0-9_-]{0,31}$`)
	idPattern   = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)
)

// Ref names an entity that can be liked, e.g. {"post", "7"}.
type Ref struct {
	Type string `json:"type"`
	ID   string `json:"id"`
}

// Validate reports ErrInvalidEntity for a type other than 1-32 lower-case
// letters, digits, '-' or '_' starting with a letter, or an id other than
// 1-64 letters, digits, '.', '-' or '_'.
func (r Ref) Validate() error {
	if !typePattern.MatchString(r.Type) {
		return fmt.Errorf("%w: type must be 1-32 lower-case letters, digits, - or _, starting with a letter; got %q", ErrInvalidEntity, r.Type)
	}
	if !idPattern.MatchString(r.ID) {
		return fmt.Errorf("%w: id must be 1-64 letters, digits, ., - or _; got %q", ErrInvalidEntity, r.ID)
	}
	return nil
}

func (r Ref) String() string { return r.Type + ":" + r.ID }

// Entity is a registered Ref and the user who receives its likes.
type Entity struct {
	Ref
	Owner int64 `json:"owner_id"`
}

// State is an entity's likes as one user sees them.
type State struct {
	Entity
	Likes int64 `json:"likes"`
	Liked bool  `json:"liked"`
}

// Key is the lock key of an entity's likes under the lock strategy.
func Key(r Ref) lockkey.Key { return lockkey.Like.Key(r.Type, r.ID) }

// Strategies.
const (
	StrategyLock    = "lock"
	StrategyHashTag = "hashtag"
)

// Options configure New.
type Options struct {
	// Locking guards the lock strategy, which needs its Locker set
	// (lockkit.None() for the unsafe baseline). Its CriticalSectionDelay
	// is slept between the membership check and the writes, widening the
	// window the lock closes. Unused by the hashtag strategy.
	guard.Locking
	// Strategy is StrategyLock (default) or StrategyHashTag.
	Strategy string
	// Prefix namespaces every key (config SHOP_KEY_PREFIX); keys are
	// Prefix + "like:…". It may not contain braces.
	Prefix string
}

// Service is the like domain. It is safe for concurrent use.
type Service struct {
	client   redis.UniversalClient
	k        keys
	strategy strategy
}

// strategy is what differs between the two layouts: where an entity's set
// and an owner's counter live, and how a like moves both.
type strategy interface {
	likers(e Entity) string
	received(owner int64) string
	owned(owner int64) string
	set(ctx context.Context, e Entity, user int64, add bool) error
	drift(ctx context.Context, owner int64, entities []Ref) (int64, error)
}

// New returns the like service on client, which may be a single node or a
// Cluster client. The client stays the caller's to close.
func New(client redis.UniversalClient, o Options) (*Service, error) {
	if strings.ContainsAny(o.Prefix, "{}") {
		return nil, fmt.Errorf("like: key prefix %q may not contain braces: they would pick the hash slot", o.Prefix)
	}
	s := &Service{client: client, k: keys{prefix: o.Prefix + "like:"}}
	switch o.Strategy {
	case StrategyLock, "":
		if o.Locker == nil {
			return nil, errors.New("like: the lock strategy needs a Locker (lockkit.None() for the unsafe baseline)")
		}
		s.strategy = &spread{client: client, k: s.k, delay: o.CriticalSectionDelay,
			guard: guard.New(lockkey.Like, o.Locking)}
	case StrategyHashTag:
		s.strategy = &tagged{client: client, k: s.k}
	default:
		return nil, fmt.Errorf("like: unknown strategy %q; want %s or %s", o.Strategy, StrategyLock, StrategyHashTag)
	}
	return s, nil
}

// keys are the names both strategies share.
type keys struct{ prefix string }

// entity maps an entity to its owner's id.
func (k keys) entity(r Ref) string { return k.prefix + "entity:" + r.String() }

// fence is the lock strategy's fence of r's liker set, in the set's slot.
// It is the one key of the domain a reset keeps (see Reset).
func (k keys) fence(r Ref) string { return k.prefix + "{" + r.String() + "}:fence" }

// isFence reports whether key is the fence of some entity: the whole key
// spelled by fence, not a suffix, since an entity may be named "fence".
func (k keys) isFence(key string) bool {
	rest, ok := strings.CutPrefix(key, k.prefix+"{")
	if !ok {
		return false
	}
	ref, ok := strings.CutSuffix(rest, "}:fence")
	if !ok {
		return false
	}
	typ, id, _ := strings.Cut(ref, ":")
	r := Ref{Type: typ, ID: id}
	return r.Validate() == nil && k.fence(r) == key
}

// owners is the set of every owner with a registered entity: what the audit
// walks.
func (k keys) owners() string { return k.prefix + "owners" }

// Register records e and its owner. Registering the same entity with the
// same owner again is a no-op that reports created false; with another
// owner it is ErrOwnerConflict.
func (s *Service) Register(ctx context.Context, e Entity) (created bool, err error) {
	if err := e.Validate(); err != nil {
		return false, err
	}
	if e.Owner <= 0 {
		return false, fmt.Errorf("%w: owner_id must be a positive integer, got %d", ErrInvalidEntity, e.Owner)
	}
	// The owner is claimed first and never overwritten; the index entries
	// follow, and a retry after a crash in between completes them.
	created, err = s.client.SetNX(ctx, s.k.entity(e.Ref), e.Owner, 0).Result()
	if err != nil {
		return false, fmt.Errorf("like: register %s: %w", e.Ref, err)
	}
	if !created {
		owner, err := s.owner(ctx, e.Ref)
		if err != nil {
			return false, err
		}
		if owner != e.Owner {
			return false, fmt.Errorf("%w: %s belongs to user %d", ErrOwnerConflict, e.Ref, owner)
		}
	}
	if err := s.client.SAdd(ctx, s.strategy.owned(e.Owner), e.Ref.String()).Err(); err != nil {
		return false, fmt.Errorf("like: register %s: %w", e.Ref, err)
	}
	if err := s.client.SAdd(ctx, s.k.owners(), e.Owner).Err(); err != nil {
		return false, fmt.Errorf("like: register %s: %w", e.Ref, err)
	}
	return created, nil
}

func (s *Service) owner(ctx context.Context, r Ref) (int64, error) {
	if err := r.Validate(); err != nil {
		return 0, err
	}
	raw, err := s.client.Get(ctx, s.k.entity(r)).Result()
	if errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("%w: no %s %q is registered", ErrEntityNotFound, r.Type, r.ID)
	}
	if err != nil {
		return 0, fmt.Errorf("like: owner of %s: %w", r, err)
	}
	return strconv.ParseInt(raw, 10, 64)
}

// Like makes user like r; liking again changes nothing. It returns the
// state after the change.
func (s *Service) Like(ctx context.Context, user int64, r Ref) (State, error) {
	return s.change(ctx, user, r, true)
}

// Unlike withdraws user's like of r; unliking again changes nothing.
func (s *Service) Unlike(ctx context.Context, user int64, r Ref) (State, error) {
	return s.change(ctx, user, r, false)
}

func (s *Service) change(ctx context.Context, user int64, r Ref, add bool) (State, error) {
	owner, err := s.owner(ctx, r)
	if err != nil {
		return State{}, err
	}
	e := Entity{Ref: r, Owner: owner}
	if err := s.strategy.set(ctx, e, user, add); err != nil {
		return State{}, err
	}
	return s.state(ctx, user, e)
}

// Get returns r's like count and whether user likes it.
func (s *Service) Get(ctx context.Context, user int64, r Ref) (State, error) {
	owner, err := s.owner(ctx, r)
	if err != nil {
		return State{}, err
	}
	return s.state(ctx, user, Entity{Ref: r, Owner: owner})
}

func (s *Service) state(ctx context.Context, user int64, e Entity) (State, error) {
	var card *redis.IntCmd
	var member *redis.BoolCmd
	_, err := s.client.Pipelined(ctx, func(p redis.Pipeliner) error {
		card = p.SCard(ctx, s.strategy.likers(e))
		member = p.SIsMember(ctx, s.strategy.likers(e), user)
		return nil
	})
	if err != nil {
		return State{}, fmt.Errorf("like: read %s: %w", e.Ref, err)
	}
	return State{Entity: e, Likes: card.Val(), Liked: member.Val()}, nil
}

// Received is the number of likes owner's entities received: the counter,
// which the audit compares with the liker sets.
func (s *Service) Received(ctx context.Context, owner int64) (int64, error) {
	n, err := s.client.Get(ctx, s.strategy.received(owner)).Int64()
	if errors.Is(err, redis.Nil) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("like: received by %d: %w", owner, err)
	}
	return n, nil
}

// Drift is the audit check: for each owner whose counter disagrees with the
// liker sets, counter - the sum of the sizes of the liker sets of the
// owner's entities, keyed by owner id. Each owner is read as one snapshot
// (under the entities' locks, or in one script); a like in flight is counted
// whole or not at all.
func (s *Service) Drift(ctx context.Context) (map[string]int64, error) {
	owners, err := s.client.SMembers(ctx, s.k.owners()).Result()
	if err != nil {
		return nil, fmt.Errorf("like: drift: %w", err)
	}
	out := map[string]int64{}
	for _, raw := range owners {
		owner, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("like: drift: owner %q: %w", raw, err)
		}
		members, err := s.client.SMembers(ctx, s.strategy.owned(owner)).Result()
		if err != nil {
			return nil, fmt.Errorf("like: drift of %d: %w", owner, err)
		}
		refs := make([]Ref, 0, len(members))
		for _, m := range members {
			typ, id, _ := strings.Cut(m, ":")
			refs = append(refs, Ref{Type: typ, ID: id})
		}
		d, err := s.strategy.drift(ctx, owner, refs)
		if err != nil {
			return nil, fmt.Errorf("like: drift of %d: %w", owner, err)
		}
		if d != 0 {
			out[raw] = d
		}
	}
	return out, nil
}
