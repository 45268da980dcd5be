package inventory

import (
	"context"
	_ "embed"
	"fmt"
	"log/slog"

	"github.com/redis/go-redis/v9"
)

//go:embed take.lua
var takeLua string

// takeScript runs with EVALSHA, falling back to EVAL after a NOSCRIPT.
var takeScript = redis.NewScript(takeLua)

// Mirror is a copy of each product's stock in Redis, decremented by one Lua
// script (check and decrement in one step, no lock). It is loaded lazily
// from the database and dropped when an admin changes the product.
type Mirror struct {
	client redis.UniversalClient
	prefix string
}

// NewMirror returns a Mirror whose keys are prefix + "stock:" + sku.
func NewMirror(client redis.UniversalClient, prefix string) *Mirror {
	return &Mirror{client: client, prefix: prefix}
}

func (m *Mirror) key(sku string) string { return m.prefix + "stock:" + sku }

// Take takes quantity units of sku, or returns ErrSoldOut. A mirror not yet
// loaded is loaded from load (the database) with SET NX, so that of two
// loaders only the first counts.
func (m *Mirror) Take(ctx context.Context, sku string, quantity int64, load func(context.Context, string) (Product, error)) error {
	for range 2 {
		res, err := takeScript.Run(ctx, m.client, []string{m.key(sku)}, quantity).Int64Slice()
		if err != nil {
			return fmt.Errorf("inventory: stock mirror: %w", err)
		}
		switch res[0] {
		case 1:
			return nil
		case 0:
			return soldOut(res[1], quantity)
		}
		p, err := load(ctx, sku)
		if err != nil {
			return err
		}
		if err := m.client.SetNX(ctx, m.key(sku), p.Stock, 0).Err(); err != nil {
			return fmt.Errorf("inventory: load stock mirror: %w", err)
		}
	}
	return fmt.Errorf("inventory: stock mirror of %q vanished twice while loading", sku)
}

// GiveBack returns units taken for a sale the database then refused.
func (m *Mirror) GiveBack(ctx context.Context, sku string, quantity int64) {
	// Only if the mirror is still there: INCRBY on a missing key would
	// create a mirror holding just these units.
	const script = `if redis.call('EXISTS', KEYS[1]) == 1 then return redis.call('INCRBY', KEYS[1], ARGV[1]) end return 0`
	if err := m.client.Eval(ctx, script, []string{m.key(sku)}, quantity).Err(); err != nil {
		slog.WarnContext(ctx, "stock mirror give-back failed; dropping it", "sku", sku, "err", err)
		m.Forget(ctx, sku)
	}
}

// Forget drops sku's mirror; the next sale reloads it from the database.
func (m *Mirror) Forget(ctx context.Context, sku string) {
	if err := m.client.Del(ctx, m.key(sku)).Err(); err != nil {
		slog.WarnContext(ctx, "stock mirror drop failed", "sku", sku, "err", err)
	}
}

// Ping checks that Redis answers.
func (m *Mirror) Ping(ctx context.Context) error { return m.client.Ping(ctx).Err() }
