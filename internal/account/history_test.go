package account

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/storage"
)

// historyStrategies are the ways a ledger row is written: each balance
// strategy's Update (fenced, unfenced, versioned), and an order's Debit.
var historyStrategies = []struct {
	name string
	opts func(l lockkit.Locker) Options
}{
	{"lock", func(l lockkit.Locker) Options { return Options{Locking: guard.Locking{Locker: l}} }},
	{"none", func(lockkit.Locker) Options { return Options{Locking: guard.Locking{Locker: lockkit.None()}} }},
	{StrategyOptimistic, func(lockkit.Locker) Options { return Options{Strategy: StrategyOptimistic} }},
}

// moveMoney runs one of every change on accounts 1 and 2 (order is the
// order id of the debit) and returns account 1's expected balance change.
func moveMoney(t *testing.T, db *gorm.DB, svc Service, order int64) int64 {
	t.Helper()
	ctx := context.Background()
	for _, err := range []error{
		second(svc.Deposit(ctx, 1, 100, Precondition{})),
		second(svc.Withdraw(ctx, 1, 30, Precondition{})),
		second(svc.Transfer(ctx, 1, 2, 50)),
		db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return Debit(tx, 1, 25, 0, order) }),
	} {
		if err != nil {
			t.Fatal(err)
		}
	}
	return 100 - 30 - 50 - 25
}

func second[T any](_ T, err error) error { return err }

// TestANewHistoryCountsOnlyItsOwnLedger: an admin PUT starts a new
// history. The old history's ledger rows stay (the orders they paid
// reconcile against them) but the balance audit counts the new history's
// only, whichever strategy wrote them.
func TestANewHistoryCountsOnlyItsOwnLedger(t *testing.T) {
	for dbName, newDB := range databases() {
		for _, st := range historyStrategies {
			t.Run(fmt.Sprintf("%s/%s", dbName, st.name), func(t *testing.T) {
				ctx := context.Background()
				db := newDB(t)
				store := NewStore(db.DB)
				locker := local.New()
				defer locker.Close()
				svc := NewService(store, st.opts(locker))
				for history := range int64(2) {
					for id := int64(1); id <= 2; id++ {
						if _, err := store.Put(ctx, id, 10_000); err != nil {
							t.Fatal(err)
						}
					}
					moved := moveMoney(t, db.DB, svc, history+1)
					if d, err := store.Drift(ctx); err != nil || len(d) != 0 {
						t.Errorf("history %d: drift %v (%v)", history, d, err)
					}
					if a, err := store.Get(ctx, 1); err != nil || a.Balance != 10_000+moved || a.History != history {
						t.Errorf("history %d: %+v (%v), want balance %d", history, a, err, 10_000+moved)
					}
				}
				for history := range int64(2) {
					var rows int64
					if err := db.Model(&LedgerEntry{}).Where("history = ?", history).Count(&rows).Error; err != nil || rows != 5 {
						t.Errorf("history %d: %d ledger rows (%v), want its 5 kept", history, rows, err)
					}
				}
			})
		}
	}
}

// TestANewHistoryStillShowsLostWrites: counting only the current history
// must not hide a drift in it: a balance moved without a ledger row, or a
// row of the new history lost, is reported after a PUT.
func TestANewHistoryStillShowsLostWrites(t *testing.T) {
	for dbName, newDB := range databases() {
		for _, tc := range []struct {
			name   string
			damage string
			want   int64
		}{
			{"balance-moved-without-a-row", "UPDATE accounts SET balance = balance + 7 WHERE id = 1", 7},
			{"row-of-the-new-history-lost", "DELETE FROM ledger_entries WHERE account_id = 1 AND history = 1 AND kind = 'deposit'", 100},
		} {
			t.Run(dbName+"/"+tc.name, func(t *testing.T) {
				ctx := context.Background()
				db := newDB(t)
				store := NewStore(db.DB)
				svc := NewService(store, Options{Locking: guard.Locking{Locker: lockkit.None()}})
				for history := range int64(2) {
					for id := int64(1); id <= 2; id++ {
						if _, err := store.Put(ctx, id, 10_000); err != nil {
							t.Fatal(err)
						}
					}
					moveMoney(t, db.DB, svc, history+1)
				}
				if d, err := store.Drift(ctx); err != nil || len(d) != 0 {
					t.Fatalf("drift before the damage: %v (%v)", d, err)
				}
				if err := db.Exec(tc.damage).Error; err != nil {
					t.Fatal(err)
				}
				d, err := store.Drift(ctx)
				if err != nil || len(d) != 1 || d["1"] != tc.want {
					t.Fatalf("drift %v (%v), want account 1 off by %d", d, err, tc.want)
				}
			})
		}
	}
}

// oldAccount and oldLedgerEntry are the tables as the version before
// histories made them: no history column.
type oldAccount struct {
	ID        int64 `gorm:"primaryKey;autoIncrement:false"`
	Balance   int64 `gorm:"not null"`
	Opening   int64 `gorm:"not null"`
	Fence     uint64
	Version   uint64
	UpdatedAt time.Time
}

func (oldAccount) TableName() string { return "accounts" }

type oldLedgerEntry struct {
	ID        int64  `gorm:"primaryKey"`
	AccountID int64  `gorm:"not null;index"`
	Amount    int64  `gorm:"not null"`
	Kind      string `gorm:"size:16;not null"`
	Fence     uint64
	CreatedAt time.Time
	OrderID   int64 `gorm:"not null;default:0;index"`
}

func (oldLedgerEntry) TableName() string { return "ledger_entries" }

// TestAnOlderLedgerMigratesIntoHistoryZero: Migrate on a database of the
// previous version adds the history columns, every row in history 0, which
// is consistent: the audit is as clean as before, and the next PUT starts
// history 1 without losing the old rows.
func TestAnOlderLedgerMigratesIntoHistoryZero(t *testing.T) {
	for dbName, newDB := range databases() {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			db := newDB(t)
			createOlderLedger(t, db)
			if err := db.Migrate(ctx, Models()...); err != nil {
				t.Fatal(err)
			}
			store := NewStore(db.DB)
			if d, err := store.Drift(ctx); err != nil || len(d) != 0 {
				t.Fatalf("drift after the migration: %v (%v)", d, err)
			}
			if created, err := store.Put(ctx, 1, 500); err != nil || created {
				t.Fatalf("put: created %v, %v", created, err)
			}
			svc := NewService(store, Options{Locking: guard.Locking{Locker: lockkit.None()}})
			if _, err := svc.Deposit(ctx, 1, 5, Precondition{}); err != nil {
				t.Fatal(err)
			}
			if d, err := store.Drift(ctx); err != nil || len(d) != 0 {
				t.Fatalf("drift after a put: %v (%v)", d, err)
			}
			debits, err := OrderLedger(db.DB)
			if err != nil || debits[3].Rows != 1 || debits[3].Cents != -1_000 {
				t.Fatalf("order 3's debit: %+v (%v), want the old row kept", debits[3], err)
			}
		})
	}
}

// createOlderLedger replaces db's account tables with the previous
// version's, holding account 1 and its debit of 10.00 for order 3.
func createOlderLedger(t *testing.T, db *storage.DB) {
	t.Helper()
	for _, table := range []string{"ledger_entries", "accounts"} {
		if err := db.Migrator().DropTable(table); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.AutoMigrate(&oldAccount{}, &oldLedgerEntry{}); err != nil {
		t.Fatal(err)
	}
	if err := db.Create(&oldAccount{ID: 1, Balance: 9_000, Opening: 10_000}).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Create(&oldLedgerEntry{AccountID: 1, Amount: -1_000, Kind: KindOrder, OrderID: 3}).Error; err != nil {
		t.Fatal(err)
	}
}

// TestTheHistoryCostsNoStatement: every flow that writes a ledger row
// reads the account's history inside that row's INSERT, never in a
// statement of its own: inside a critical section each round trip is paid
// by every writer queued behind it.
func TestTheHistoryCostsNoStatement(t *testing.T) {
	for dbName, newDB := range databases() {
		t.Run(dbName, func(t *testing.T) {
			ctx := context.Background()
			db := newDB(t)
			log := shoptest.NewStatementLog()
			traced := db.DB.Session(&gorm.Session{Logger: log})
			store := NewStore(traced)
			for id := int64(1); id <= 2; id++ {
				if _, err := store.Put(ctx, id, 10_000); err != nil {
					t.Fatal(err)
				}
			}
			locker := local.New()
			defer locker.Close()
			for _, st := range historyStrategies {
				log.Take()
				moveMoney(t, traced, NewService(store, st.opts(locker)), 1)
				statements := log.Take()
				var inserts int
				for _, sql := range statements {
					switch {
					case strings.HasPrefix(sql, "INSERT INTO `ledger_entries`"):
						inserts++
					case strings.Contains(sql, "history"):
						t.Errorf("%s: a statement of its own reads the history: %s", st.name, sql)
					}
				}
				if inserts != 5 {
					t.Errorf("%s: %d ledger inserts, want 5 in %q", st.name, inserts, statements)
				}
			}
		})
	}
}
