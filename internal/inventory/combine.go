package inventory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/lockkey"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/instrument"
)

// combined is the lock strategy with the buyers of one SKU combined: the
// purchases that queue in this process while one is being served are
// served together by the next grant, in arrival order, in one
// transaction (one claim, one read, one stock write, one multi-row
// insert). A hot key then pays the lock hand-off and the two commits once
// per batch instead of once per unit.
//
// Safety is the single path's, with these limits:
//   - one lease covers the whole batch: if it is lost (fenced backends) the
//     write is refused and every purchase of the batch fails with 503
//     fenced; on a backend that cannot fence, the window in which a lost
//     lease can overwrite a newer holder is the batch's, so it is bounded
//     by maxBatch;
//   - the batch commits all or nothing: one failing insert fails all;
//   - products with a per-user limit are not combined (one limit check
//     failing would fail the batch): they take the single path;
//   - across processes the lock is fair in grants, not in units: one
//     process's batch of n holds the key for n sales.
type combined struct {
	single   *locked // the path of a lone or limited purchase
	store    *Store
	metrics  *instrument.Metrics
	maxBatch int
	// waitBudget is the lock wait timeout (zero: none), which bounds a
	// buyer's wait for its batch too.
	waitBudget time.Duration
	// delay is the business work, once per batch: the read, decide and
	// write it stands for are done once for the whole batch.
	delay time.Duration

	mu     sync.Mutex
	queues map[string]*skuQueue
}

// skuQueue is one SKU's purchases waiting in this process. leading is true
// while some goroutine serves them.
type skuQueue struct {
	pending []*queued
	leading bool
}

// queued is one purchase waiting for a batch.
type queued struct {
	ctx      context.Context
	user     int64
	quantity int64
	done     chan queuedResult // the purchase's outcome
	lead     chan struct{}     // this purchase's goroutine must serve the next batch
}

type queuedResult struct {
	p   Purchase
	err error
}

func newCombined(single *locked, o Options) *combined {
	var lo lockkit.Options
	for _, opt := range o.LockOptions {
		opt(&lo)
	}
	return &combined{single: single, store: single.store, metrics: o.Metrics, maxBatch: o.Combine,
		waitBudget: lo.WaitTimeout, delay: o.CriticalSectionDelay, queues: map[string]*skuQueue{}}
}

func (c *combined) Get(ctx context.Context, sku string) (Product, error) {
	return c.single.Get(ctx, sku)
}

func (c *combined) Purchase(ctx context.Context, user int64, sku string, quantity int64) (Purchase, error) {
	if err := validate(sku, quantity); err != nil {
		return Purchase{}, err
	}
	prod, err := c.store.Get(ctx, sku)
	if err != nil {
		return Purchase{}, err
	}
	if prod.PerUserLimit > 0 {
		return c.single.Purchase(ctx, user, sku, quantity)
	}
	o := &queued{ctx: ctx, user: user, quantity: quantity, done: make(chan queuedResult, 1), lead: make(chan struct{}, 1)}
	q := c.enqueue(sku, o)
	var budget <-chan time.Time
	if c.waitBudget > 0 {
		t := time.NewTimer(c.waitBudget)
		defer t.Stop()
		budget = t.C
	}
	for {
		select {
		case r := <-o.done:
			return r.p, r.err
		case <-o.lead:
			c.serveNext(sku, q)
		case <-budget:
			budget = nil
			if c.leave(q, o) {
				return Purchase{}, fmt.Errorf("inventory: %s: queued past the lock wait budget: %w", sku, lockkit.ErrNotAcquired)
			}
		}
	}
}

// leave takes o out of q while it waits for a batch; it reports false
// once o leads or is in a batch being served, whose answer o then waits
// for. A queued buyer so waits no longer than a buyer on the single path
// waits for the lock; one that leads waits for the lock once more.
func (c *combined) leave(q *skuQueue, o *queued) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(o.lead) > 0 {
		return false
	}
	i := slices.Index(q.pending, o)
	if i < 0 {
		return false
	}
	q.pending = slices.Delete(q.pending, i, i+1)
	return true
}

// enqueue queues o on sku's queue, and gives it the lead when no
// goroutine serves the queue.
func (c *combined) enqueue(sku string, o *queued) *skuQueue {
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.queues[sku]
	if q == nil {
		q = &skuQueue{}
		c.queues[sku] = q
	}
	q.pending = append(q.pending, o)
	if !q.leading {
		q.leading = true
		o.lead <- struct{}{}
	}
	return q
}

// serveNext serves up to maxBatch of q's pending purchases, then hands the
// lead to the first one still pending, if any: a leader answers its own
// buyer after one batch instead of serving the queue for ever.
func (c *combined) serveNext(sku string, q *skuQueue) {
	c.mu.Lock()
	n := min(len(q.pending), c.maxBatch)
	batch := q.pending[:n:n]
	q.pending = q.pending[n:]
	c.mu.Unlock()

	c.serve(sku, batch)

	c.mu.Lock()
	defer c.mu.Unlock()
	if len(q.pending) == 0 {
		q.leading = false
		delete(c.queues, sku)
		return
	}
	q.pending[0].lead <- struct{}{}
}

// serve sells batch under one grant. Buyers who left while queued, or
// while the batch waited for the grant, are answered with their context's
// error and take no part.
func (c *combined) serve(sku string, batch []*queued) {
	live := answerDeparted(batch)
	switch len(live) {
	case 0:
		return
	case 1:
		c.serveAlone(sku, live[0])
		return
	}
	purchases, sold, err := c.sellBatch(sku, live)
	c.countFencedBuyers(err, len(live))
	// A key that another run recorded rolled the whole batch back; alone,
	// it is refused by itself and the others are sold their units.
	if errors.Is(err, errNotCombinable) || errors.Is(err, keyed.ErrKeyTaken) {
		for _, o := range live {
			c.serveAlone(sku, o)
		}
		return
	}
	for i, o := range live {
		o.done <- batchResult(err, sold[i], purchases[i], o)
	}
}

// answerDeparted answers the buyers of batch whose context ended with its
// error, and returns the others.
func answerDeparted(batch []*queued) []*queued {
	live := batch[:0:0]
	for _, o := range batch {
		if err := context.Cause(o.ctx); err != nil {
			o.done <- queuedResult{err: err}
			continue
		}
		live = append(live, o)
	}
	return live
}

// serveAlone sells to o on the single path.
func (c *combined) serveAlone(sku string, o *queued) {
	p, err := c.single.Purchase(o.ctx, o.user, sku, o.quantity)
	o.done <- queuedResult{p: p, err: err}
}

// sellBatch sells to live in one transaction under one grant of sku's
// lock: purchases[i] is live[i]'s, sold to it if sold[i].
func (c *combined) sellBatch(sku string, live []*queued) (purchases []Purchase, sold []bool, err error) {
	ctx, cancel := batchContext(live)
	defer cancel()
	purchases = make([]Purchase, len(live))
	sold = make([]bool, len(live))
	buyers := make([]context.Context, len(live))
	for i, o := range live {
		buyers[i] = o.ctx
	}
	// Sales the store accepted under an unbeaten fence stand even if the
	// lease is found lost after (guard.Do).
	k := Key(sku)
	err = c.single.guard.Do(ctx, []lockkey.Key{k}, func(ctx context.Context, f guard.Fences) error {
		for i, o := range live {
			purchases[i] = Purchase{SKU: sku, UserID: o.user, Quantity: o.quantity, Strategy: StrategyLock, Fence: f.Of(k)}
		}
		return c.store.updateMany(ctx, sku, f.Of(k), batch{purchases: purchases, sold: sold, buyers: buyers}, c.delay)
	})
	return purchases, sold, err
}

// batchContext is the context a batch of live buyers is served in. It
// outlives any one buyer's request, as it serves them all, but not the
// last: when every buyer has left (a shutdown cancels them all), the wait
// for the lock ends with the last one's cause. A write already begun
// finishes regardless (writeBatch).
func batchContext(live []*queued) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(live[0].ctx))
	ctx, cancelTimeout := context.WithTimeout(ctx, writeTimeout+time.Minute)
	var left atomic.Int64
	stops := make([]func() bool, len(live))
	for i, o := range live {
		stops[i] = context.AfterFunc(o.ctx, func() {
			if int(left.Add(1)) == len(live) {
				cancel(context.Cause(o.ctx))
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancelTimeout()
		cancel(nil)
	}
}

// countFencedBuyers counts a batch of buyers refused as fenced (err) in
// shop_fenced_writes_total, one per buyer: the guard counted the batch
// once, and every buyer in it is answered ErrFenced.
func (c *combined) countFencedBuyers(err error, buyers int) {
	if c.metrics == nil || !errors.Is(err, lockkit.ErrFenced) {
		return
	}
	for range buyers - 1 {
		c.metrics.Fenced(lockkey.Stock)
	}
}

// batchResult is batch buyer o's answer: the batch's error, the purchase
// it was sold, its own context's error if it left before it was sold
// anything, or sold out.
func batchResult(err error, sold bool, p Purchase, o *queued) queuedResult {
	switch {
	case err != nil:
		return queuedResult{err: err}
	case sold:
		return queuedResult{p: p}
	case context.Cause(o.ctx) != nil:
		return queuedResult{err: context.Cause(o.ctx)}
	}
	return queuedResult{err: soldOut(0, o.quantity)}
}

// errNotCombinable: the product gained a per-user limit since the buyers
// queued; they take the single path.
var errNotCombinable = errors.New("inventory: product has a per-user limit; not combined")

// batch is the buyers of one SKU served under one grant: purchases[i] is
// the request buyers[i]'s, sold to it if sold[i].
type batch struct {
	purchases []Purchase
	sold      []bool
	buyers    []context.Context
}

// updateMany is Update for a batch of purchases of one SKU under one
// fence: it claims the row, reads it, sells to each purchase in order
// while stock lasts, and writes the stock with one insert of every sold
// purchase in one transaction, with the idempotency record of each keyed
// buyer. Nothing is written if none is sold.
func (s *Store) updateMany(ctx context.Context, sku string, fence uint64, b batch, delay time.Duration) error {
	ps, sold := b.purchases, b.sold
	prod, err := s.claimCombinable(ctx, sku, fence)
	if err != nil {
		return err
	}
	rows, rowBuyers := allot(&prod, ps, sold, b.buyers)
	if len(rows) == 0 {
		return nil
	}
	err = guard.Work(ctx, delay)
	if err == nil {
		err = s.writeBatch(ctx, sku, prod, fence, rows, rowBuyers)
	}
	if err != nil {
		clear(sold)
		return err
	}
	// Hand the inserted rows (with their ids) back in the callers' order.
	j := 0
	for i := range ps {
		if sold[i] {
			ps[i] = rows[j]
			j++
		}
	}
	return nil
}

// claimCombinable claims sku's row with fence and reads it, unless the
// product has a per-user limit.
func (s *Store) claimCombinable(ctx context.Context, sku string, fence uint64) (Product, error) {
	if err := s.claim(ctx, sku, fence); err != nil {
		return Product{}, err
	}
	prod, err := s.Get(ctx, sku)
	if err != nil {
		return Product{}, err
	}
	if prod.PerUserLimit > 0 {
		return Product{}, errNotCombinable
	}
	return prod, nil
}

// allot sells prod's stock to each of ps in order while it lasts, marking
// sold[i], and returns the purchases sold with their buyers. It runs under
// the grant: a buyer whose request ended while the batch waited for it
// (buyers[i] done: the client went, a shutdown, a lost idempotency lease)
// is sold nothing, as no one would be told of the sale.
func allot(prod *Product, ps []Purchase, sold []bool, buyers []context.Context) (rows []Purchase, rowBuyers []context.Context) {
	for i := range ps {
		if buyers[i] != nil && buyers[i].Err() != nil {
			continue
		}
		if prod.Stock >= ps[i].Quantity {
			prod.Stock -= ps[i].Quantity
			sold[i] = true
			rows = append(rows, ps[i])
			rowBuyers = append(rowBuyers, buyers[i])
		}
	}
	return rows, rowBuyers
}

// writeBatch writes prod's stock and inserts rows in one transaction, with
// the answers of their buyers.
func (s *Store) writeBatch(ctx context.Context, sku string, prod Product, fence uint64, rows []Purchase,
	buyers []context.Context) error {
	if s.beforeWrite != nil {
		s.beforeWrite(ctx)
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	return s.db.WithContext(wctx).Transaction(func(tx *gorm.DB) error {
		if err := writeStock(tx, prod, fence); err != nil {
			return err
		}
		sale, err := currentSale(tx, sku)
		if err != nil {
			return err
		}
		for i := range rows {
			rows[i].Sale = sale
		}
		if err := tx.Create(&rows).Error; err != nil {
			return err
		}
		return saveAnswers(tx, buyers, rows)
	})
}

// saveAnswers records, in the batch's transaction tx, each keyed buyer's
// answer: the purchase row it was sold. One buyer whose key another run
// recorded fails the batch, which rolls back; none was charged, and serve
// sells to each buyer on the single path.
func saveAnswers(tx *gorm.DB, buyers []context.Context, rows []Purchase) error {
	for i, ctx := range buyers {
		keyed.Result(ctx, &rows[i])
		if err := keyed.Save(ctx, tx); err != nil {
			return err
		}
	}
	return nil
}
