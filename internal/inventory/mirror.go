package inventory

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	//go:embed take.lua
	takeLua string
	//go:embed load.lua
	loadLua string
	//go:embed forget.lua
	forgetLua string
	//go:embed give_back.lua
	giveBackLua string

	// Scripts run with EVALSHA, falling back to EVAL after a NOSCRIPT.
	takeScript     = redis.NewScript(takeLua)
	loadScript     = redis.NewScript(loadLua)
	forgetScript   = redis.NewScript(forgetLua)
	giveBackScript = redis.NewScript(giveBackLua)
)

// markerTTL is how long a take or a give-back remembers that it ran, so
// that go-redis's resend of a script whose reply was lost (its connection
// dropped after the script ran) changes nothing. It outlasts every resend:
// they are sent within the call's own timeout. One marker per sale lives
// this long: 136 bytes each (MEMORY USAGE), 4 MB at 1,000 sales a second.
const markerTTL = 30 * time.Second

// marker names one take or give-back of sku's mirror, in the mirror's slot.
func (m *Mirror) marker(sku, op string) string {
	return m.key(sku) + ":" + op + ":" + rand.Text()
}

// recheckEvery bounds how often one process checks a sold-out answer of
// the mirror against the database, per SKU: sold-out traffic is what the
// mirror keeps away from the database.
const recheckEvery = time.Second

// Loader reads a product from the database.
type Loader func(context.Context, string) (Product, error)

// Mirror is a copy of each product's stock in Redis, decremented by one Lua
// script (check and decrement in one step, no lock). It is loaded lazily
// from the database and dropped after every change of the product that
// does not go through it (an admin put, an order); a load that read the
// database before such a drop is refused (load.lua), and a sold-out answer
// is checked against the database now and then.
type Mirror struct {
	client redis.UniversalClient
	prefix string

	mu      sync.Mutex
	checked map[string]time.Time // last check of a sold-out answer, per SKU

	// afterRead, when set by a test, runs between a load's read of the
	// database and its write of the mirror.
	afterRead func(ctx context.Context)
}

// NewMirror returns a Mirror whose keys are prefix + "stock:{<sku>}" and,
// beside it in the same hash slot, the count of its drops ":drops".
func NewMirror(client redis.UniversalClient, prefix string) *Mirror {
	return &Mirror{client: client, prefix: prefix, checked: map[string]time.Time{}}
}

func (m *Mirror) key(sku string) string { return m.prefix + "stock:{" + sku + "}" }

func (m *Mirror) keys(sku string) []string { return []string{m.key(sku), m.key(sku) + ":drops"} }

// errUnsettled is Take's answer when the mirror changed under its load:
// it took nothing, and the database alone decides this sale.
var errUnsettled = errors.New("inventory: the stock mirror changed while it was loaded")

// Take takes quantity units of sku, or returns ErrSoldOut. A mirror not yet
// loaded is loaded from load (the database); a sold-out answer while the
// database holds the units reloads it. A load that a change refused is
// tried again; when changes refuse every try, it takes nothing and returns
// errUnsettled.
func (m *Mirror) Take(ctx context.Context, sku string, quantity int64, load Loader) (Taken, error) {
	keys := append(m.keys(sku), m.marker(sku, "took"))
	for range 3 {
		res, err := takeScript.Run(ctx, m.client, keys, quantity, markerTTL.Milliseconds()).Int64Slice()
		if err != nil {
			return 0, fmt.Errorf("inventory: stock mirror: %w", err)
		}
		switch {
		case res[0] == 1 && len(res) == 3:
			return Taken(res[2]), nil
		case res[0] == 0 && !m.soldOutIsWrong(ctx, sku, quantity, load):
			return 0, soldOut(res[1], quantity)
		case res[0] == -1:
			// A refused load tries again: a faster loader's mirror, or a
			// load from a newer read, counts this sale.
			if err := m.load(ctx, sku, load); err != nil && !errors.Is(err, errUnsettled) {
				return 0, err
			}
		}
	}
	return 0, errUnsettled
}

// Taken names the mirror a Take took its units from: the count of its
// drops then.
type Taken int64

// load fills sku's mirror from the database, unless it was dropped after
// the read began: that read may predate a change, and the next Take loads
// again.
func (m *Mirror) load(ctx context.Context, sku string, load Loader) error {
	drops, err := m.client.Get(ctx, m.keys(sku)[1]).Result()
	if errors.Is(err, redis.Nil) {
		drops, err = "0", nil
	}
	if err != nil {
		return fmt.Errorf("inventory: load stock mirror: %w", err)
	}
	p, err := load(ctx, sku)
	if err != nil {
		return err
	}
	if m.afterRead != nil {
		m.afterRead(ctx)
	}
	loaded, err := loadScript.Run(ctx, m.client, m.keys(sku), p.Stock, drops).Int()
	if err != nil {
		return fmt.Errorf("inventory: load stock mirror: %w", err)
	}
	if loaded == 0 {
		return errUnsettled
	}
	return nil
}

// soldOutIsWrong checks a sold-out answer against the database, at most
// once per recheckEvery per SKU in this process, and drops the mirror if
// the database holds the units: a mirror short of them (a load raced a
// change, units of a lost commit) would refuse every buyer until the
// product next changes.
func (m *Mirror) soldOutIsWrong(ctx context.Context, sku string, quantity int64, load Loader) bool {
	m.mu.Lock()
	if time.Since(m.checked[sku]) < recheckEvery {
		m.mu.Unlock()
		return false
	}
	m.checked[sku] = time.Now()
	m.mu.Unlock()
	p, err := load(ctx, sku)
	if err != nil || p.Stock < quantity {
		return false
	}
	m.Forget(ctx, sku)
	return true
}

// GiveBack returns units taken for a sale the database then refused.
func (m *Mirror) GiveBack(ctx context.Context, sku string, quantity int64, from Taken) {
	keys := append(m.keys(sku), m.marker(sku, "gave"))
	if err := giveBackScript.Run(ctx, m.client, keys, quantity, int64(from), markerTTL.Milliseconds()).Err(); err != nil {
		slog.WarnContext(ctx, "stock mirror give-back failed; dropping it", "sku", sku, "err", err)
		m.Forget(ctx, sku)
	}
}

// Forget drops sku's mirror; the next sale reloads it from the database.
// Call it after a change of sku's stock committed.
func (m *Mirror) Forget(ctx context.Context, sku string) {
	if err := forgetScript.Run(ctx, m.client, m.keys(sku)).Err(); err != nil {
		slog.WarnContext(ctx, "stock mirror drop failed", "sku", sku, "err", err)
	}
}

// Ping checks that Redis answers.
func (m *Mirror) Ping(ctx context.Context) error { return m.client.Ping(ctx).Err() }

// MirrorDrift is the audit check of the atomic-redis stock mirror: per
// SKU whose mirror is loaded, the mirror's stock minus the database's.
// Negative means units the database holds that the mirror refuses to
// sell; positive, sales the mirror lets through to the database's guard.
// Purchases in flight show here until they commit: read it at rest.
func (s *Store) MirrorDrift(ctx context.Context) (map[string]int64, error) {
	out := map[string]int64{}
	if s.mirror == nil {
		return out, nil
	}
	var ps []Product
	if err := s.db.WithContext(ctx).Select("sku", "stock").Find(&ps).Error; err != nil {
		return out, err
	}
	for _, p := range ps {
		v, err := s.mirror.client.Get(ctx, s.mirror.key(p.SKU)).Int64()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("inventory: read stock mirror: %w", err)
		}
		if d := v - p.Stock; d != 0 {
			out[p.SKU] = d
		}
	}
	return out, nil
}
