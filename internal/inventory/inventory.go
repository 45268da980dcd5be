// Package inventory sells limited stock (seckill): POST
// /api/v1/seckill/{sku}/purchase decrements a product's stock and records
// one insert-only purchase row per sale.
//
// Four strategies, chosen by config, do the decrement:
//   - lock: read, check and write in Go under lock:stock:<sku>, the write
//     fenced in the store. With the none backend this is the unsafe baseline
//     that oversells.
//   - atomic-sql: UPDATE ... SET stock = stock - n WHERE stock >= n; the
//     database does check and write in one statement, no lock needed.
//   - atomic-redis: one Lua script decrements a Redis mirror of the stock,
//     turning sold-out traffic away before the database, then atomic-sql's
//     guarded UPDATE writes (the guard, not the mirror, prevents overselling).
//   - optimistic: read, check and write in Go without a lock; the write
//     lands only over the version it read, and a loser reads again.
//
// Each is a Service. The lock strategy runs its read-modify-write under
// package guard, which takes the lock, hands its fence to the store and
// counts the writes a fence refused.
package inventory

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/optimistic"
)

// Errors of the inventory domain, mapped to statuses in http.go.
var (
	// ErrNotFound: no product has this SKU.
	ErrNotFound = errors.New("product not found")
	// ErrSoldOut: the stock is lower than the quantity asked.
	ErrSoldOut = errors.New("sold out")
	// ErrLimitExceeded: the user would buy more than the per-user limit.
	ErrLimitExceeded = errors.New("purchase limit exceeded")
	// ErrInvalidQuantity: the quantity is zero or negative.
	ErrInvalidQuantity = errors.New("invalid quantity")
)

// skuPattern is the one spelling of a SKU. It is spelled as it is into
// the lock key, the Redis mirror's keys and the rows, so it has one case:
// another spelling refused here can never reach a row under a lock key
// of its own, whatever the database's collation.
var skuPattern = regexp.MustCompile(`^[a-z0-9._-]{1,64}$`)

// ValidSKU reports whether sku is well-formed: 1 to 64 lower-case letters,
// digits, dots, dashes or underscores.
func ValidSKU(sku string) bool { return skuPattern.MatchString(sku) }

// CheckSKU returns nil for a well-formed SKU, else ErrNotFound saying why:
// a SKU is a name, and a malformed one names no product.
func CheckSKU(sku string) error {
	if ValidSKU(sku) {
		return nil
	}
	if lower := strings.ToLower(sku); ValidSKU(lower) {
		return fmt.Errorf("%w: no product %q: SKUs are lower case, as in %q", ErrNotFound, sku, lower)
	}
	return fmt.Errorf("%w: no product %q", ErrNotFound, sku)
}

// Product is one item on sale.
type Product struct {
	SKU   string `gorm:"primaryKey;size:64" json:"sku"`
	Name  string `gorm:"size:200;not null" json:"name"`
	Stock int64  `gorm:"not null" json:"stock"`
	// InitialStock is the stock the product was put on sale with; the
	// audit compares the units in purchase rows with it.
	InitialStock int64 `gorm:"not null" json:"initial_stock"`
	PriceCents   int64 `gorm:"not null" json:"price_cents"`
	// PerUserLimit caps the units one user may buy; 0 is no limit.
	PerUserLimit int64  `gorm:"not null;default:0" json:"per_user_limit"`
	Fence        uint64 `gorm:"not null;default:0" json:"-"`
	// Version is bumped by every write of Stock; the optimistic strategy
	// writes only over the version it read (optimistic.go).
	Version uint64 `gorm:"not null;default:0" json:"-"`
	// Sale counts the admin puts that replaced the product: each starts a
	// new sale, and a purchase row belongs to the sale it was written in.
	Sale      int64     `gorm:"not null;default:0" json:"-"`
	UpdatedAt time.Time `json:"-"`
}

// Purchase is one sale, never updated.
type Purchase struct {
	ID        int64     `gorm:"primaryKey" json:"purchase_id"`
	SKU       string    `gorm:"size:64;not null;index" json:"sku"`
	UserID    int64     `gorm:"not null;index" json:"user_id"`
	Quantity  int64     `gorm:"not null" json:"quantity"`
	Strategy  string    `gorm:"size:16;not null" json:"strategy"`
	Fence     uint64    `gorm:"not null;default:0" json:"-"`
	CreatedAt time.Time `json:"created_at"`
	// OrderID is the order that reserved (quantity > 0) or returned
	// (quantity < 0) these units; 0 for a seckill sale.
	OrderID int64 `gorm:"not null;default:0;index" json:"-"`
	// Sale is the product's sale when the row was written: the stock
	// audit counts the current sale's rows only, the order audit all.
	Sale int64 `gorm:"not null;default:0" json:"-"`
}

// PurchaseLimit counts the units one user bought of one SKU, so that the
// per-user limit is one conditional UPDATE, atomic under every strategy.
type PurchaseLimit struct {
	UserID int64  `gorm:"primaryKey;autoIncrement:false"`
	SKU    string `gorm:"primaryKey;size:64"`
	Units  int64  `gorm:"not null"`
}

// Service is the inventory domain as handlers and other domains see it.
type Service interface {
	Get(ctx context.Context, sku string) (Product, error)
	// Purchase sells quantity units of sku to user.
	Purchase(ctx context.Context, user int64, sku string, quantity int64) (Purchase, error)
}

// Key is the lock key of sku's stock.
func Key(sku string) lockkey.Key { return lockkey.Stock.Key(sku) }

// Strategies.
const (
	StrategyLock        = "lock"
	StrategyAtomicSQL   = "atomic-sql"
	StrategyAtomicRedis = "atomic-redis"
	StrategyOptimistic  = "optimistic"
)

// Options configure NewService.
type Options struct {
	// Locking guards the lock strategy. Its CriticalSectionDelay stands
	// in for business work in every strategy: between read and write
	// under the lock; before the atomic write in the atomic strategies.
	guard.Locking
	// Strategy is StrategyLock (default), StrategyAtomicSQL,
	// StrategyAtomicRedis or StrategyOptimistic.
	Strategy string
	// Mirror is the Redis stock mirror, required by atomic-redis.
	Mirror *Mirror
	// Combine, above 1, is the most purchases of one SKU that the lock
	// strategy serves under one grant (combine.go); 0 or 1 serves each
	// purchase under its own.
	Combine int
	// Retry bounds and counts the optimistic strategy's attempts.
	Retry optimistic.Retry
}

// NewService returns the inventory service for o.Strategy.
func NewService(store *Store, o Options) (Service, error) {
	var s Service
	switch o.Strategy {
	case StrategyLock, "":
		l := &locked{store: store, delay: o.CriticalSectionDelay,
			guard: guard.New(lockkey.Stock, o.Locking)}
		s = l
		if o.Combine > 1 {
			s = newCombined(l, o)
		}
	case StrategyAtomicSQL:
		s = &atomicSQL{store: store, delay: o.CriticalSectionDelay}
	case StrategyAtomicRedis:
		if o.Mirror == nil {
			return nil, errors.New("inventory: atomic-redis needs a Redis mirror")
		}
		s = &atomicRedis{store: store, mirror: o.Mirror, delay: o.CriticalSectionDelay}
	case StrategyOptimistic:
		s = newOptimistic(store, o)
	default:
		return nil, fmt.Errorf("inventory: unknown strategy %q", o.Strategy)
	}
	return s, nil
}

func validate(sku string, quantity int64) error {
	if err := CheckSKU(sku); err != nil {
		return err
	}
	if quantity <= 0 {
		return fmt.Errorf("%w: quantity must be a positive integer, got %d", ErrInvalidQuantity, quantity)
	}
	return nil
}

// locked is the lock strategy: read, check and write in Go under
// lock:stock:<sku>, the write fenced in the store.
type locked struct {
	store *Store
	delay time.Duration
	guard *guard.Guard
}

func (s *locked) Get(ctx context.Context, sku string) (Product, error) {
	return s.store.Get(ctx, sku)
}

func (s *locked) Purchase(ctx context.Context, user int64, sku string, quantity int64) (Purchase, error) {
	if err := validate(sku, quantity); err != nil {
		return Purchase{}, err
	}
	// Unknown SKUs are turned away before they name a lock: a backend keeps
	// a fence counter for every key ever locked.
	if _, err := s.store.Get(ctx, sku); err != nil {
		return Purchase{}, err
	}
	k := Key(sku)
	var out Purchase
	err := s.guard.Do(ctx, []lockkey.Key{k}, func(ctx context.Context, f guard.Fences) error {
		p := Purchase{SKU: sku, UserID: user, Quantity: quantity, Strategy: StrategyLock}
		keyed.Result(ctx, &p)
		err := s.store.Update(ctx, &p, f.Of(k), func(ctx context.Context, prod *Product) error {
			if prod.Stock < quantity {
				return soldOut(prod.Stock, quantity)
			}
			prod.Stock -= quantity
			return guard.Work(ctx, s.delay)
		})
		out = p
		return err
	})
	return out, err
}

func soldOut(left, asked int64) error {
	if left == 0 {
		return fmt.Errorf("%w: no units left", ErrSoldOut)
	}
	return fmt.Errorf("%w: %d left, %d asked", ErrSoldOut, left, asked)
}

// atomicSQL lets the database check and decrement in one statement.
type atomicSQL struct {
	store *Store
	delay time.Duration
}

func (s *atomicSQL) Get(ctx context.Context, sku string) (Product, error) {
	return s.store.Get(ctx, sku)
}

func (s *atomicSQL) Purchase(ctx context.Context, user int64, sku string, quantity int64) (Purchase, error) {
	if err := validate(sku, quantity); err != nil {
		return Purchase{}, err
	}
	if err := guard.Work(ctx, s.delay); err != nil {
		return Purchase{}, err
	}
	p := Purchase{SKU: sku, UserID: user, Quantity: quantity, Strategy: StrategyAtomicSQL}
	keyed.Result(ctx, &p)
	return p, s.store.Decrement(ctx, &p)
}

// atomicRedis decrements the Redis mirror first, then writes SQL.
type atomicRedis struct {
	store  *Store
	mirror *Mirror
	delay  time.Duration
}

func (s *atomicRedis) Get(ctx context.Context, sku string) (Product, error) {
	return s.store.Get(ctx, sku)
}

func (s *atomicRedis) Purchase(ctx context.Context, user int64, sku string, quantity int64) (Purchase, error) {
	if err := validate(sku, quantity); err != nil {
		return Purchase{}, err
	}
	if err := guard.Work(ctx, s.delay); err != nil {
		return Purchase{}, err
	}
	// A mirror that changes dropped under every load of this sale takes no
	// units: the database's guard decides alone, as it always has the last
	// word.
	from, err := s.mirror.Take(ctx, sku, quantity, s.store.Get)
	taken := err == nil
	if err != nil && !errors.Is(err, errUnsettled) {
		return Purchase{}, err
	}
	p := Purchase{SKU: sku, UserID: user, Quantity: quantity, Strategy: StrategyAtomicRedis}
	keyed.Result(ctx, &p)
	err = s.store.Decrement(ctx, &p)
	s.settle(ctx, sku, quantity, from, taken, err)
	return p, err
}

// settle brings sku's mirror in line with the database's answer err to a
// sale whose units the mirror gave (taken) or did not. On a context of its
// own: the request may be gone, the mirror must not stay short.
func (s *atomicRedis) settle(ctx context.Context, sku string, quantity int64, from Taken, taken bool, err error) {
	if (err == nil) == taken {
		return // the mirror and the database agree
	}
	gctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if taken && (errors.Is(err, ErrLimitExceeded) || errors.Is(err, keyed.ErrKeyTaken)) {
		// A refusal the database decided (a limit, a key another run
		// recorded) wrote nothing: the units go back.
		s.mirror.GiveBack(gctx, sku, quantity, from)
		return
	}
	// A sale that bypassed the mirror drops it, as every such change does:
	// a mirror loaded meanwhile may not count it. A failure after the
	// mirror gave units may have committed (a lost COMMIT reply) or says
	// the mirror was wrong (sold out in the database): drop the mirror,
	// the next sale reloads it from the database.
	s.mirror.Forget(gctx, sku)
}
