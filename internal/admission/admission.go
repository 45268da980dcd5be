// Package admission sheds the requests a route cannot serve before they
// cost anything: no database, no Redis, no lock. Each route pattern has an
// adaptive concurrency Limiter that finds its own level from the latency it
// observes; a request past it is answered at once with 503, Retry-After and
// a problem of type overloaded, and changes nothing. A flash sale offers
// ten buyers for every unit it can sell: without this they queue in the
// HTTP server, the connection pool and the retry loops until every buyer,
// the lucky ones too, waits for seconds.
//
// The limiter is written here rather than taken from a library.
// sentinel-golang's per-resource rules are fixed thresholds (requests per
// second, concurrency) and its adaptive rule is one for the whole process,
// driven by CPU load; go-concurrency-limits (the Go port of Netflix's)
// fits the algorithm but brings its own metric-registry interface and
// strategy framework to adapt to Prometheus and gin. What is needed is an
// admit-or-refuse with a gradient on latency: about a hundred lines.
package admission

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/lockbench/shop/internal/optimistic"
	"github.com/lockbench/shop/internal/problem"
)

// RetryAfter is the Retry-After of a shed request, in seconds.
const RetryAfter = 1

// Admission holds one Limiter per route pattern.
type Admission struct {
	o      Options
	routes sync.Map // route pattern -> *Limiter

	admitted, shed *prometheus.CounterVec
	limit          *prometheus.GaugeVec
}

// New returns an Admission whose limiters start from o, and registers its
// metrics on reg.
func New(o Options, reg prometheus.Registerer) *Admission {
	a := &Admission{
		o: o,
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_admission_admitted_total",
			Help: "Requests the adaptive concurrency limit admitted, by route pattern.",
		}, []string{"route"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_admission_shed_total",
			Help: "Requests refused with 503 before any work because the route was at its concurrency limit, by route pattern.",
		}, []string{"route"}),
		limit: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "shop_admission_limit",
			Help: "The adaptive concurrency limit of a route pattern: requests it serves at once.",
		}, []string{"route"}),
	}
	reg.MustRegister(a.admitted, a.shed, a.limit)
	return a
}

// Handler is gin middleware that admits a request under its route's limit
// or sheds it. It goes after authentication and after the body is read,
// right before the handler: a slot is then held only by a request the
// service can work on at once, and the latency the limit steers by is the
// service's, never the time a client takes to send its body. A refusal
// still costs less than a sale: no database, Redis or lock.
func (a *Admission) Handler() gin.HandlerFunc {
	return func(c *gin.Context) {
		route := c.FullPath()
		l := a.limiter(route)
		if !l.Acquire() {
			a.shed.WithLabelValues(route).Inc()
			refuse(c)
			return
		}
		a.admitted.WithLabelValues(route).Inc()
		start := time.Now()
		defer func() {
			if l.Release(time.Since(start), lostRace(c)) {
				a.limit.WithLabelValues(route).Set(float64(l.Limit()))
			}
		}()
		c.Next()
	}
}

// lostRace reports whether the request lost an optimistic race: work that
// sold nothing, and of which fewer at once make fewer. A lock that stayed
// busy is not one: it is queueing, which latency already shows, and the
// combining that batches a lock's buyers needs many of them at once.
func lostRace(c *gin.Context) bool {
	for _, e := range c.Errors {
		if errors.Is(e.Err, optimistic.ErrConflict) {
			return true
		}
	}
	return false
}

func (a *Admission) limiter(route string) *Limiter {
	if l, ok := a.routes.Load(route); ok {
		return l.(*Limiter)
	}
	l, loaded := a.routes.LoadOrStore(route, NewLimiter(a.o))
	if !loaded {
		a.limit.WithLabelValues(route).Set(float64(a.o.Initial))
	}
	return l.(*Limiter)
}

// refuse answers 503 without problem.Write's log line: a flood sheds
// thousands a second, and the metrics count them.
func refuse(c *gin.Context) {
	e := problem.New(http.StatusServiceUnavailable, "overloaded",
		"this route is serving all the requests it can; retry after "+strconv.Itoa(RetryAfter)+" s")
	e.Title = "Overloaded"
	e.RetryAfter = RetryAfter
	d, h := problem.Table(nil).From(e)
	for k, v := range h {
		c.Writer.Header()[k] = v
	}
	problem.Render(c, d)
}
