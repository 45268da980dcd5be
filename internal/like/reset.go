package like

import (
	"context"
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
// fixture's entities. It implements audit.Resetter. Fence keys stay: a
// holder of a lock taken before the reset must still be refused. Run it
// while no traffic flows: a like in flight may land in the new state.
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
		for it.Next(ctx) {
			if s.k.isFence(it.Val()) {
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
		return flush()
	}
	if cluster, ok := s.client.(*redis.ClusterClient); ok {
		return cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return scan(ctx, node)
		})
	}
	return scan(ctx, s.client)
}
