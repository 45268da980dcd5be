package like

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// fixtures are the entities of each named fixture (see docs/likes-orders.md).
var fixtures = map[string]func() []Entity{
	// Five posts of three users: enough to like by hand and to see one
	// owner's counter gather likes from several entities.
	"default": func() []Entity { return posts(5, 3) },
	// A hundred posts of ten users, for k6.
	"loadtest": func() []Entity { return posts(100, 10) },
}

func posts(n, owners int) []Entity {
	out := make([]Entity, n)
	for i := range out {
		out[i] = Entity{Ref: Ref{Type: "post", ID: strconv.Itoa(i + 1)}, Owner: int64(i%owners + 1)}
	}
	return out
}

// Reset deletes every like, counter and registration, then registers the
// fixture's entities. It implements audit.Resetter. Fence keys stay, each
// raised by one: a holder of a lock taken before the reset must still be
// refused, and one that checked a set before the reset must not write the
// new one from what it saw (raise_fence.lua). Run it while no traffic
// flows: an unfenced like in flight may land in the new state.
func (s *Service) Reset(ctx context.Context, fixture string) error {
	build, ok := fixtures[fixture]
	if !ok {
		return fmt.Errorf("like: no fixture %q", fixture)
	}
	if err := s.clear(ctx); err != nil {
		return fmt.Errorf("like: reset: %w", err)
	}
	for _, e := range build() {
		if _, err := s.Register(ctx, e); err != nil {
			return fmt.Errorf("like: reset: %w", err)
		}
	}
	return nil
}

//go:embed raise_fence.lua
var raiseFenceLua string

var raiseFenceScript = redis.NewScript(raiseFenceLua)

// raiseFence raises the fence key by one (raise_fence.lua).
func raiseFence(ctx context.Context, node redis.UniversalClient, key string) error {
	v, err := node.Get(ctx, key).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		return err
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return fmt.Errorf("fence %s holds %q: %w", key, v, err)
	}
	return raiseFenceScript.Run(ctx, node, []string{key}, v, strconv.FormatUint(n+1, 10)).Err()
}

// globEscape quotes the characters SCAN's MATCH pattern would read as a
// glob, so that a prefix holding them matches only itself.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`\*?[]`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// clear deletes the domain's keys on every master: SCAN sees one node only.
func (s *Service) clear(ctx context.Context) error {
	scan := func(ctx context.Context, node redis.UniversalClient) error {
		it := node.Scan(ctx, 0, globEscape(s.k.prefix)+"*", 500).Iterator()
		var batch []string
		flush := func() error {
			if len(batch) == 0 {
				return nil
			}
			// One key per command: a multi-key DEL across slots is
			// refused by a cluster.
			_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
				for _, k := range batch {
					p.Unlink(ctx, k)
				}
				return nil
			})
			batch = batch[:0]
			return err
		}
		var fences []string
		for it.Next(ctx) {
			if s.k.isFence(it.Val()) {
				fences = append(fences, it.Val())
				continue
			}
			batch = append(batch, it.Val())
			if len(batch) == 500 {
				if err := flush(); err != nil {
					return err
				}
			}
		}
		if err := it.Err(); err != nil {
			return err
		}
		if err := flush(); err != nil {
			return err
		}
		for _, f := range fences {
			if err := raiseFence(ctx, node, f); err != nil {
				return err
			}
		}
		return nil
	}
	if cluster, ok := s.client.(*redis.ClusterClient); ok {
		return cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return scan(ctx, node)
		})
	}
	return scan(ctx, s.client)
}
