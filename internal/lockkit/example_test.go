package lockkit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/local"
)

// deposit adds amount to account id under the account's lock. Every write
// is checked by the store against the fence, so DoFenced is the call to
// make: a write the store accepted stands, whatever became of the lease
// after it.
func deposit(ctx context.Context, locker lockkit.Locker, store *accounts, id, amount int) error {
	key := fmt.Sprintf("lock:account:%d", id)
	return lockkit.DoFenced(ctx, locker, key, func(ctx context.Context, fence uint64) error {
		// Show the token to the store before reading: from here on, the
		// write of a holder whose lease ran out is refused.
		if err := store.Claim(id, fence); err != nil {
			return err
		}
		balance := store.Balance(id)
		// The write lands only while the account still carries our token.
		return store.SetBalance(id, balance+amount, fence)
	}, lockkit.WithWaitTimeout(5*time.Second))
}

func ExampleDoFenced() {
	locker := local.New() // or redislock.New(client), mysqllock.New(db), etcdlock.New(endpoints), ...
	defer locker.Close()
	store := newAccounts()

	err := deposit(context.Background(), locker, store, 42, 250)
	switch {
	case err == nil:
		fmt.Println("balance", store.Balance(42))
	case errors.Is(err, lockkit.ErrNotAcquired):
		fmt.Println("account busy: try again") // 503 with Retry-After: the request changed nothing
	case errors.Is(err, lockkit.ErrFenced):
		fmt.Println("a newer holder wrote first: nothing of ours landed")
	case errors.Is(err, lockkit.ErrUnavailable):
		fmt.Println("lock server down") // 503
	default:
		fmt.Println(err)
	}
	// Output: balance 250
}

// A holder that pauses past its lease (a GC pause, a slow call) while
// another takes the key and writes is refused by the store: its token is
// older than the one the account carries now.
func ExampleDoFenced_staleHolder() {
	ctx := context.Background()
	locker := local.New()
	defer locker.Close()
	store := newAccounts()

	err := lockkit.DoFenced(ctx, locker, "lock:account:42", func(ctx context.Context, fence uint64) error {
		if err := store.Claim(42, fence); err != nil {
			return err
		}
		balance := store.Balance(42)
		<-ctx.Done()                                              // the lease runs out...
		_ = deposit(context.Background(), locker, store, 42, 100) // ...and the next holder deposits
		return store.SetBalance(42, balance+250, fence)
	}, lockkit.WithTTL(50*time.Millisecond))
	fmt.Println(errors.Is(err, lockkit.ErrFenced), store.Balance(42))
	// Output: true 100
}

// Do cancels fn's context, with cause ErrLeaseLost, once the lease is lost,
// and answers ErrLeaseLost when fn returns after that: fn's work ran at
// least partly without the lock.
func ExampleDo_leaseLost() {
	locker := local.New()
	defer locker.Close()

	err := lockkit.Do(context.Background(), locker, "job:nightly-report", func(ctx context.Context, _ uint64) error {
		select {
		case <-time.After(time.Second): // work that outlasts its lease
			return nil
		case <-ctx.Done():
			return context.Cause(ctx) // stop before writing
		}
	}, lockkit.WithTTL(50*time.Millisecond)) // WithTTL: no watchdog renews it
	if errors.Is(err, lockkit.ErrLeaseLost) {
		fmt.Println("report abandoned:", err)
	}
	// Output: report abandoned: lockkit: lease lost
}

// accounts is an in-memory store that checks every write against the
// fence, as internal/account/store.go does in SQL: Claim raises an
// account's fence to the token before its holder reads (UPDATE ... SET
// fence = ? WHERE id = ? AND fence < ?), and SetBalance lands only while the
// account still carries that token (UPDATE ... WHERE id = ? AND fence = ?).
type accounts struct {
	mu      sync.Mutex
	balance map[int]int
	fence   map[int]uint64
}

func newAccounts() *accounts {
	return &accounts{balance: make(map[int]int), fence: make(map[int]uint64)}
}

// Claim refuses a token no newer than the account's: an older holder's, or
// one that claimed the account already. It refuses 0 too, the token of a
// backend that cannot fence: this store needs one that can.
func (s *accounts) Claim(id int, fence uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fence <= s.fence[id] {
		return fmt.Errorf("%w: account %d, token %d", lockkit.ErrFenced, id, fence)
	}
	s.fence[id] = fence
	return nil
}

func (s *accounts) Balance(id int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.balance[id]
}

func (s *accounts) SetBalance(id, balance int, fence uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fence[id] != fence {
		return fmt.Errorf("%w: account %d, token %d", lockkit.ErrFenced, id, fence)
	}
	s.balance[id] = balance
	return nil
}
