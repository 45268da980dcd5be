package order

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
)

// Closers on two processes with local locks (which exclude nothing across
// them) and a third on Redis race pays on the same expired orders: the
// leader lease and the row locks do not hold them apart, the rows' fences
// do, so every order ends paid or cancelled with each effect once.
func TestClosersWhoseLocksDoNotExcludeEachOtherStillMoveEachOrderOnce(t *testing.T) {
	s := newShop(t, Options{})
	a, b := local.New(), local.New()
	defer a.Close()
	defer b.Close()
	services := append(s.raceInstances(1, a), s.raceInstances(1, b)...)
	services = append(services, s.raceInstances(1, s.locker)...)
	s.raceCloseAndPay(services, 6)
	s.auditOK()
}

// A round whose leader lease is lost between the SELECT of expired orders
// and the first cancel writes nothing; the next round closes them all.
func TestRoundStopsBeforeItsFirstWriteWhenTheLeaseIsLost(t *testing.T) {
	s := newShop(t, Options{PayTimeout: 50 * time.Millisecond})
	ctx := context.Background()
	for range 3 {
		if _, _, err := s.service.Place(ctx, user, "k"+random(), "widget", 1, false); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(60 * time.Millisecond)
	round, lose := context.WithCancelCause(ctx)
	s.orders.beforeWrite = func(context.Context) { lose(lockkit.ErrLeaseLost) }
	if n, err := s.service.CloseExpired(round, slog.Default()); n != 0 || err == nil {
		t.Fatalf("a round that lost its lease closed %d, %v", n, err)
	}
	s.orders.beforeWrite = nil
	if st := s.state(); st.returns != 0 {
		t.Fatalf("after the lost round: %+v", st)
	}
	if n, err := s.service.CloseExpired(ctx, slog.Default()); n != 3 || err != nil {
		t.Fatalf("the next round closed %d, %v; want 3", n, err)
	}
	s.auditOK()
}
