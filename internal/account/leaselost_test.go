package account

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
)

// TestWriteThatLandedBeforeTheLeaseWasLostSucceeds: the lease is lost in
// the moment after the fenced write landed and before lockkit.Do looks at
// Lost again. Do then reports ErrLeaseLost, which the API answers as
// "nothing was changed"; but the store accepted the write under a fence no
// later holder had beaten, so it stands, and the caller must be told so.
func TestWriteThatLandedBeforeTheLeaseWasLostSucceeds(t *testing.T) {
	ctx := context.Background()
	store := sqliteStore(t)
	for id := int64(1); id <= 2; id++ {
		if _, err := store.Put(ctx, id, 10_000); err != nil {
			t.Fatal(err)
		}
	}
	locker := &loseAfterWrite{} // one counter: fences of later cases beat earlier ones
	// Every lease is lost as soon as a ledger row is written: inside the
	// write's transaction, which commits whatever happens to the lease.
	var wrote bool
	if err := store.db.Callback().Create().After("gorm:create").Register("test:lose", func(db *gorm.DB) {
		if db.Statement.Table == "ledger_entries" && db.Error == nil {
			wrote = true
			locker.loseAll()
		}
	}); err != nil {
		t.Fatal(err)
	}
	svc := NewService(store, Options{Locking: guard.Locking{Locker: locker}})
	for _, tc := range []struct {
		name string
		call func(Service) error
	}{
		{"deposit", func(s Service) error { _, err := s.Deposit(ctx, 1, 100, Precondition{}); return err }},
		{"withdraw", func(s Service) error { _, err := s.Withdraw(ctx, 1, 100, Precondition{}); return err }},
		{"transfer", func(s Service) error { _, err := s.Transfer(ctx, 1, 2, 100); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wrote = false
			if err := tc.call(svc); err != nil {
				t.Fatalf("a write the store accepted was reported as %v", err)
			}
			if !wrote {
				t.Fatal("the write did not run")
			}
		})
	}
}

// loseAfterWrite grants every key at once with a lease that is lost only
// when loseAll is called.
type loseAfterWrite struct {
	mu     sync.Mutex
	leases []*fakeLease
	fence  uint64
}

func (l *loseAfterWrite) Acquire(ctx context.Context, key string, _ ...lockkit.Option) (lockkit.Lease, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.fence++
	lease := &fakeLease{key: key, fence: l.fence, lost: make(chan struct{})}
	l.leases = append(l.leases, lease)
	return lease, nil
}

func (l *loseAfterWrite) TryAcquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	return l.Acquire(ctx, key, opts...)
}

func (l *loseAfterWrite) Close() error { return nil }

func (l *loseAfterWrite) loseAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, lease := range l.leases {
		lease.once.Do(func() { close(lease.lost) })
	}
}

type fakeLease struct {
	key   string
	fence uint64
	lost  chan struct{}
	once  sync.Once
}

func (f *fakeLease) Key() string                                 { return f.key }
func (f *fakeLease) Fence() uint64                               { return f.fence }
func (f *fakeLease) Lost() <-chan struct{}                       { return f.lost }
func (f *fakeLease) Extend(context.Context, time.Duration) error { return errors.New("not held") }
func (f *fakeLease) Release(context.Context) error               { return nil }
