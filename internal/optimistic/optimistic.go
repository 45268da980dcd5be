// Package optimistic is the retry loop of optimistic concurrency (seed 000
// §2.3.2), the third way to stop a lost update besides a lock and a single
// atomic statement: read the row and its version, decide in Go, write with
// `UPDATE ... SET version = version + 1 ... WHERE id = ? AND version = ?`,
// and when another writer moved the version in between, read again.
//
// The stores own the versioned write; this package owns how often and how
// late to try again, and what the client hears when the bound runs out.
package optimistic

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ErrConflict: the row changed under every attempt the policy allowed.
//
// It is a 503 with Retry-After, not a 409: the request is valid and the
// resource is in no state the client must resolve; the server lost a race
// it will likely win a second later. 409 is what a client that sent the
// version itself (If-Match) should get, and shop's clients do not.
var ErrConflict = errors.New("write conflict")

// ErrMoved is what a store's versioned write returns when the version it
// read is no longer the row's: Do retries on it.
var ErrMoved = errors.New("row changed since it was read")

// Policy bounds the retries.
type Policy struct {
	// Attempts is the most reads-and-writes of one request, first included.
	Attempts int
	// Base is the backoff before the second attempt; each later one
	// doubles it, up to Cap. The sleep is drawn uniformly in [0, backoff]
	// ("full jitter"), so that the losers of one race do not meet again.
	Base, Cap time.Duration
}

// DefaultPolicy: 8 attempts, at most ~0.2 s of backoff in all. Beyond
// that a hot row is past what optimistic writes can sell, and the
// client is better told to come back than held.
var DefaultPolicy = Policy{Attempts: 8, Base: time.Millisecond, Cap: 50 * time.Millisecond}

// Retry is what a domain's optimistic strategy takes: the policy and the
// metrics that count it. The app builds one and hands the same value to
// every domain. The zero value is DefaultPolicy, counting nothing.
type Retry struct {
	// Policy bounds the attempts; a Policy with zero Attempts is
	// DefaultPolicy.
	Policy Policy
	// Metrics, if not nil, counts the attempts and their outcomes.
	Metrics *Metrics
}

// Do is Do with r's policy and metrics.
func (r Retry) Do(ctx context.Context, domain string, attempt func(ctx context.Context) error) error {
	p := r.Policy
	if p.Attempts == 0 {
		p = DefaultPolicy
	}
	return Do(ctx, p, r.Metrics, domain, attempt)
}

// Metrics counts attempts, so that a report can show retries per success.
type Metrics struct {
	attempts *prometheus.CounterVec
	outcomes *prometheus.CounterVec
}

// NewMetrics registers shop_optimistic_attempts_total and
// shop_optimistic_requests_total{outcome} on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_optimistic_attempts_total",
			Help: "Versioned writes tried by the optimistic strategies, first tries included.",
		}, []string{"domain"}),
		outcomes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_optimistic_requests_total",
			Help: "Requests of the optimistic strategies by outcome: done (any answer but a conflict) or conflict (retries ran out).",
		}, []string{"domain", "outcome"}),
	}
	reg.MustRegister(m.attempts, m.outcomes)
	return m
}

// Do runs attempt until it returns anything but ErrMoved, at most
// p.Attempts times, sleeping a jittered backoff between tries. It returns
// attempt's last error, or ErrConflict (wrapping the count) when every
// attempt found the row moved. m may be nil.
func Do(ctx context.Context, p Policy, m *Metrics, domain string, attempt func(ctx context.Context) error) error {
	backoff := p.Base
	for i := 1; ; i++ {
		if m != nil {
			m.attempts.WithLabelValues(domain).Inc()
		}
		err := attempt(ctx)
		if !errors.Is(err, ErrMoved) {
			if m != nil {
				m.outcomes.WithLabelValues(domain, "done").Inc()
			}
			return err
		}
		if i >= p.Attempts {
			if m != nil {
				m.outcomes.WithLabelValues(domain, "conflict").Inc()
			}
			return fmt.Errorf("%w: the row changed under each of %d attempts; try again", ErrConflict, i)
		}
		if err := sleep(ctx, rand.N(backoff+1)); err != nil {
			return err
		}
		backoff = min(2*backoff, p.Cap)
	}
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}
