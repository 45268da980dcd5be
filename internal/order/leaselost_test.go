package order

import (
	"context"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
)

// losingLocker grants through the Redis lock, but every lease it grants
// reports itself lost once lose is called: the lease ran out while the
// holder's transaction was committing.
type losingLocker struct {
	lockkit.Locker
	lost chan struct{}
	once sync.Once
}

func (l *losingLocker) lose() { l.once.Do(func() { close(l.lost) }) }

func (l *losingLocker) Acquire(ctx context.Context, key string, opts ...lockkit.Option) (lockkit.Lease, error) {
	lease, err := l.Locker.Acquire(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	return losingLease{Lease: lease, lost: l.lost}, nil
}

type losingLease struct {
	lockkit.Lease
	lost chan struct{}
}

func (l losingLease) Lost() <-chan struct{} { return l.lost }

// A change whose transaction committed under fences no later holder beat
// is a success, even when Do then finds the lease lost: answering
// lease-lost ("nothing was changed") would be a lie, and a client without
// a key would pay again.
func TestCommittedChangeStandsWhenTheLeaseIsLostAfter(t *testing.T) {
	for _, tc := range []struct {
		name  string
		table string // the lease is lost as the transaction inserts a row here
		run   func(s *shop, svc *Service, arm func()) error
	}{
		{"place-and-pay", "ledger_entries", func(s *shop, svc *Service, arm func()) error {
			arm()
			_, _, err := svc.Place(context.Background(), user, "k", "widget", 1, true)
			return err
		}},
		{"pay", "ledger_entries", func(s *shop, svc *Service, arm func()) error {
			o, _, err := s.service.Place(context.Background(), user, "k", "widget", 1, false)
			if err != nil {
				t.Fatal(err)
			}
			arm()
			_, err = svc.Pay(context.Background(), user, o.ID)
			return err
		}},
		{"close", "purchases", func(s *shop, svc *Service, arm func()) error {
			o, _, err := s.service.Place(context.Background(), user, "k", "widget", 1, false)
			if err != nil {
				t.Fatal(err)
			}
			time.Sleep(svc.o.PayTimeout)
			arm()
			closed, err := svc.closeOne(context.Background(), o.ID)
			if err == nil && !closed {
				t.Error("closeOne reports nothing closed")
			}
			return err
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newShop(t, Options{})
			locker := &losingLocker{Locker: s.locker, lost: make(chan struct{})}
			svc := NewService(s.orders, Options{Locking: guard.Locking{Locker: locker}, PayTimeout: 50 * time.Millisecond})
			name := "test:lose:" + random()
			armed := false
			if err := s.db.Callback().Create().After("gorm:create").Register(name, func(db *gorm.DB) {
				if armed && db.Statement.Table == tc.table {
					locker.lose()
				}
			}); err != nil {
				t.Fatal(err)
			}
			defer func() { _ = s.db.Callback().Create().Remove(name) }()
			if err := tc.run(s, svc, func() { armed = true }); err != nil {
				t.Fatalf("the change committed, yet: %v", err)
			}
			select {
			case <-locker.lost:
			default:
				t.Fatal("the lease was never lost: the test proved nothing")
			}
			s.auditOK()
		})
	}
}
