package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/contrib/instrumentation/github.com/gin-gonic/gin/otelgin"

	"github.com/lockbench/shop/internal/admission"
	"github.com/lockbench/shop/internal/apidoc"
	"github.com/lockbench/shop/internal/audit"
	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/problem"
)

type routerDeps struct {
	cfg     config.Config
	log     *slog.Logger
	auth    *auth.Auth
	auditor *audit.Auditor
	domains []domain
	// problems maps every error a handler returns to its answer.
	problems problem.Table
	reg      *prometheus.Registry
	metrics  http.Handler
	ready    func(context.Context) map[string]error
	// degraded, if set, names dependencies that are down without making
	// the instance unready (the events' broker).
	degraded func(context.Context) map[string]error
}

func newRouter(d routerDeps) http.Handler {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	// A path that differs by a slash is another path: redirecting a POST
	// is more surprising to an API client than a 404.
	r.RedirectTrailingSlash = false
	r.RedirectFixedPath = false
	r.HandleMethodNotAllowed = true
	r.ContextWithFallback = true

	// Counted first, so that the metrics see every answer, shed ones too.
	r.Use(newHTTPMetrics(d.reg).observe)
	// The request's span next, so that every log line of the request
	// carries its trace id (requestIDHandler). Probes and scrapes are not
	// traced: they would be most of the traces and none of the interest.
	r.Use(otelgin.Middleware("shop", otelgin.WithGinFilter(func(c *gin.Context) bool {
		return c.FullPath() != "/healthz" && c.FullPath() != "/readyz" && c.FullPath() != "/metrics"
	})), requestID, accessLog(d.log), problem.Errors(d.problems), problem.Recover(),
		problem.LimitBody(d.cfg.MaxBodyBytes), problem.Query())
	r.NoRoute(problem.NoRoute)
	r.NoMethod(problem.NoMethod)

	r.GET("/healthz", func(c *gin.Context) { c.JSON(http.StatusOK, gin.H{"status": "ok"}) })
	r.GET("/readyz", readyz(d.ready, d.degraded))
	if d.cfg.MetricsOnHTTPAddr() {
		r.GET("/metrics", gin.WrapH(d.metrics))
	}
	apidoc.Register(r)

	// A request takes its admission slot only once its caller is known and
	// its body is in memory: a client that sends slowly or not at all
	// would otherwise hold a slot of its route (and count its dawdling as
	// the route's latency) for as long as the server's ReadTimeout, and a
	// few such clients would shed everyone else.
	api := r.Group("/api/v1", d.auth.User(), problem.ReadBody())
	if d.cfg.Admission {
		api.Use(admission.New(admissionOptions(d.cfg), d.reg).Handler())
	}
	admin := r.Group("/admin/v1", d.auth.Admin())
	d.auditor.Register(admin)
	for _, dom := range d.domains {
		dom.Register(api, admin)
	}
	return router{r}
}

// router is the gin engine, with HEAD answered as GET without the body
// (RFC 9110 §9.3.2): the route runs as a GET, and net/http, which still
// sees the HEAD it received, sends the headers only.
type router struct{ *gin.Engine }

func (r router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method == http.MethodHead {
		req = req.Clone(req.Context())
		req.Method = http.MethodGet
	}
	r.Engine.ServeHTTP(w, req)
}

func admissionOptions(cfg config.Config) admission.Options {
	o := admission.Defaults
	o.Target, o.Min, o.Max = cfg.AdmissionTarget, cfg.AdmissionMinLimit, cfg.AdmissionMaxLimit
	o.Initial = min(max(o.Initial, o.Min), o.Max)
	return o
}

func readyz(ready, degraded func(context.Context) map[string]error) gin.HandlerFunc {
	return problem.Handle(func(c *gin.Context) error {
		down := ready(c.Request.Context())
		if len(down) == 0 {
			body := gin.H{"status": "ready"}
			if degraded != nil {
				if d := degraded(c.Request.Context()); len(d) > 0 {
					// Still ready: taking the instance out of the load
					// balancer would refuse the orders whose events wait.
					names := map[string]string{}
					for name, err := range d {
						names[name] = err.Error()
					}
					body["degraded"] = names
				}
			}
			c.JSON(http.StatusOK, body)
			return nil
		}
		names := make([]string, 0, len(down))
		for name, err := range down {
			if errors.Is(err, errReadyTimeout) {
				name += " (timed out)"
			}
			names = append(names, name)
			slog.WarnContext(c.Request.Context(), "not ready", "dependency", name, "err", err)
		}
		slices.Sort(names)
		e := problem.New(http.StatusServiceUnavailable, "not-ready", "not ready; down: "+strings.Join(names, ", "))
		e.Title = "Not ready"
		return e
	})
}

var goodRequestID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

// requestID keeps the caller's X-Request-Id if it is sane, so that a trace
// spans the load balancer and shop, and makes one up otherwise.
func requestID(c *gin.Context) {
	id := c.GetHeader(problem.RequestIDHeader)
	if !goodRequestID.MatchString(id) {
		var b [8]byte
		_, _ = rand.Read(b[:])
		id = hex.EncodeToString(b[:])
	}
	c.Header(problem.RequestIDHeader, id)
	c.Request = c.Request.WithContext(context.WithValue(c.Request.Context(), requestIDKey{}, id))
	c.Next()
}

func accessLog(log *slog.Logger) gin.HandlerFunc {
	return func(c *gin.Context) {
		start := time.Now()
		c.Next()
		// A flood sheds thousands a second; the metrics count them, and a
		// line for each would cost more than the refusal.
		if problem.SlugOf(c) == "overloaded" {
			return
		}
		status := c.Writer.Status()
		level := slog.LevelInfo
		if status >= 500 {
			level = slog.LevelWarn
		}
		// request_id comes from the context (requestIDHandler).
		attrs := []slog.Attr{
			slog.String("method", c.Request.Method),
			slog.String("path", c.Request.URL.Path),
			slog.String("route", route(c)),
			slog.Int("status", status),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
		}
		if user := auth.UserID(c); user != 0 {
			attrs = append(attrs, slog.Int64("user", user))
		}
		if len(c.Errors) > 0 {
			attrs = append(attrs, slog.String("err", c.Errors.Last().Error()))
		}
		log.LogAttrs(c.Request.Context(), level, "request", attrs...)
	}
}

// route is the matched route pattern, never the raw path: a label per
// account id or SKU would grow the series without bound.
func route(c *gin.Context) string {
	if r := c.FullPath(); r != "" {
		return r
	}
	return "unmatched"
}

// knownMethods are the methods a metric label may carry as sent; any other
// is counted as OTHER, or each made-up method would mint new series
// (CVE-2022-21698, fixed in promhttp the same way).
var knownMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
}

func methodLabel(m string) string {
	if knownMethods[m] {
		return m
	}
	return "OTHER"
}

type httpMetrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	shed     *prometheus.CounterVec
}

// shedSlugs are the problems that are load shed: contention or the
// concurrency limit (admission) turned the request away, nothing changed,
// and a retry in a moment will likely succeed. They are 503s, and counted in shop_http_shed_total as well, so
// that an alert on errors leaves them out and shedding on a hot key stays
// visible without paging. outcome-unknown is not one: its change may have
// landed.
var shedSlugs = map[string]bool{"lock-busy": true, "conflict": true, "overloaded": true}

func newHTTPMetrics(reg prometheus.Registerer) *httpMetrics {
	m := &httpMetrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_http_requests_total",
			Help: "HTTP requests answered, by route pattern, method and status code.",
		}, []string{"route", "method", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "shop_http_request_duration_seconds",
			Help:    "Time to answer an HTTP request, by route pattern and method.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2.5, 12),
		}, []string{"route", "method"}),
		shed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "shop_http_shed_total",
			Help: "HTTP requests turned away by contention or the concurrency limit with nothing changed (503 lock-busy, conflict, overloaded), by route, method and problem; also counted in shop_http_requests_total.",
		}, []string{"route", "method", "reason"}),
	}
	b := readBuildInfo()
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "shop_build_info",
		Help:        "Always 1; the labels say which build of shop this process runs.",
		ConstLabels: prometheus.Labels{"version": b.Version, "revision": b.Revision, "goversion": b.GoVersion},
	})
	build.Set(1)
	reg.MustRegister(m.requests, m.duration, m.shed, build)
	return m
}

func (m *httpMetrics) observe(c *gin.Context) {
	start := time.Now()
	c.Next()
	rt, method := route(c), methodLabel(c.Request.Method)
	m.requests.WithLabelValues(rt, method, strconv.Itoa(c.Writer.Status())).Inc()
	m.duration.WithLabelValues(rt, method).Observe(time.Since(start).Seconds())
	if slug := problem.SlugOf(c); shedSlugs[slug] {
		m.shed.WithLabelValues(rt, method, slug).Inc()
	}
}
