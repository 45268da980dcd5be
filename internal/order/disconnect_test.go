package order

import (
	"context"
	"errors"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/inventory"
	"github.com/lockbench/shop/internal/lockkit"
)

// step is a moment at which a client hangs up: its request context is
// cancelled then.
type step struct {
	name string
	// arm sets the hang-up up on s for the request whose context cancel
	// ends; it returns a function that undoes it.
	arm func(s *shop, cancel context.CancelFunc) (disarm func())
	// committed is whether the change has landed by that moment.
	committed bool
}

// inCreate cancels the request as soon as the transaction has inserted a
// row of table: it is inside the transaction, before the commit.
func inCreate(table string) func(*shop, context.CancelFunc) func() {
	return func(s *shop, cancel context.CancelFunc) func() {
		name := "test:hangup:" + random()
		err := s.db.Callback().Create().After("gorm:create").Register(name, func(db *gorm.DB) {
			if db.Statement.Table == table {
				cancel()
			}
		})
		if err != nil {
			s.t.Fatal(err)
		}
		return func() { _ = s.db.Callback().Create().Remove(name) }
	}
}

func steps(table string) []step {
	return []step{
		{name: "before-the-request", arm: func(_ *shop, cancel context.CancelFunc) func() { cancel(); return func() {} }},
		{name: "waiting-for-a-lock", arm: func(s *shop, cancel context.CancelFunc) func() {
			lease, err := s.locker.Acquire(context.Background(), inventory.Key("widget").String())
			if err != nil {
				s.t.Fatal(err)
			}
			lease2, err := s.locker.Acquire(context.Background(), Key(1).String())
			if err != nil {
				s.t.Fatal(err)
			}
			timer := time.AfterFunc(100*time.Millisecond, cancel)
			return func() {
				timer.Stop()
				_ = lease.Release(context.Background())
				_ = lease2.Release(context.Background())
			}
		}},
		{name: "in-the-critical-section", arm: func(_ *shop, cancel context.CancelFunc) func() {
			timer := time.AfterFunc(100*time.Millisecond, cancel)
			return func() { timer.Stop() }
		}},
		{name: "at-the-write", arm: func(s *shop, cancel context.CancelFunc) func() {
			s.orders.beforeWrite = func(context.Context) { cancel() }
			return func() { s.orders.beforeWrite = nil }
		}},
		{name: "inside-the-transaction", arm: inCreate(table), committed: true},
	}
}

// A client that hangs up at any step of placing an order leaves either no
// trace or the whole order, and its retry with the same key converges to
// one order: the hang-up never strands a half-done order.
func TestClientHangUpAtEachStepOfPlace(t *testing.T) {
	for _, st := range steps("purchases") {
		t.Run(st.name, func(t *testing.T) {
			s := newShop(t, Options{Locking: guard.Locking{CriticalSectionDelay: 300 * time.Millisecond}})
			ctx, cancel := context.WithCancel(context.Background())
			disarm := st.arm(s, cancel)
			_, _, err := s.service.Place(ctx, user, "k", "widget", 2, true)
			hungUp := ctx.Err() != nil
			disarm()
			cancel()
			if !hungUp {
				t.Fatal("the client did not hang up at this step")
			}
			if st.committed != (err == nil) {
				t.Fatalf("place: %v; want committed %v", err, st.committed)
			}
			if got := s.state(); st.committed && got.orders != 1 || !st.committed && got != (state{balance: opening, stock: stock}) {
				t.Fatalf("after the hang-up: %+v", got)
			}
			s.auditOK()

			o, existing, err := s.service.Place(context.Background(), user, "k", "widget", 2, true)
			if err != nil || o.Status != StatusPaid || existing != st.committed {
				t.Fatalf("retry: %+v existing %v, %v", o, existing, err)
			}
			want := state{orders: 1, debits: 1, reservations: 1, balance: opening - 2*price, stock: stock - 2, events: 2}
			if got := s.state(); got != want {
				t.Fatalf("after the retry: %+v; want %+v", got, want)
			}
			s.auditOK()
		})
	}
}

// The same for pay: a hang-up at any step debits nothing or debits once,
// and the retry answers the paid order with one debit.
func TestClientHangUpAtEachStepOfPay(t *testing.T) {
	for _, st := range steps("ledger_entries") {
		t.Run(st.name, func(t *testing.T) {
			s := newShop(t, Options{Locking: guard.Locking{CriticalSectionDelay: 300 * time.Millisecond}})
			placed, _, err := s.service.Place(context.Background(), user, "k", "widget", 2, false)
			if err != nil || placed.ID != 1 {
				t.Fatalf("place: %+v, %v (the lock step expects order 1)", placed, err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			disarm := st.arm(s, cancel)
			_, err = s.service.Pay(ctx, user, placed.ID)
			hungUp := ctx.Err() != nil
			disarm()
			cancel()
			if !hungUp {
				t.Fatal("the client did not hang up at this step")
			}
			if st.committed != (err == nil) {
				t.Fatalf("pay: %v; want committed %v", err, st.committed)
			}
			if !st.committed && !errors.Is(err, context.Canceled) && !errors.Is(err, lockkit.ErrNotAcquired) {
				t.Fatalf("pay: %v; want the cancellation", err)
			}
			s.auditOK()
			o, err := s.service.Pay(context.Background(), user, placed.ID)
			if err != nil || o.Status != StatusPaid {
				t.Fatalf("retry: %+v, %v", o, err)
			}
			if got := s.state(); got.debits != 1 || got.balance != opening-2*price {
				t.Fatalf("after the retry: %+v; want one debit", got)
			}
			s.auditOK()
		})
	}
}
