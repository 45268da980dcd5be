package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/problem"
)

// maxStoredBody caps what is kept per key; a larger response is sent but
// not stored, and the key is freed.
const maxStoredBody = 1 << 20

// finishTimeout bounds the writes after the handler, which run detached
// from the request: a response sent must be stored even if the client left.
// A variable for tests.
var finishTimeout = 5 * time.Second

const (
	noStoreKey = "idem.nostore"
	tokenKey   = "idem.token"
)

// Key is the Idempotency-Key of a request the middleware let through, for
// handlers that record it (an order row keeps it, unique per user); "" on
// an Optional route called without one.
func Key(c *gin.Context) string { return c.GetString(tokenKey) }

// DoNotStore marks the response being written as one a retry must not get
// again: e.g. "an earlier attempt is still in progress". The key is freed.
func DoNotStore(c *gin.Context) { c.Set(noStoreKey, true) }

// Models are the tables of this package, for migrations.
func Models() []any { return keyed.Models() }

// Problems are idem's rows of the API's problem table: a second run of
// one key whose change the first run's record refused (keyed.Save).
func Problems() []problem.Mapping {
	return []problem.Mapping{{Target: keyed.ErrKeyTaken, Status: http.StatusConflict, Slug: "idempotency-key-in-use",
		Title: "Idempotency-Key in use", Detail: inUseDetail, RetryAfter: 1}}
}

// Reply sends answer a: the one a keyed change's record holds (keyed.Decide).
func Reply(c *gin.Context, a keyed.Answer) {
	maps.Copy(c.Writer.Header(), a.Header)
	c.JSON(a.Status, a.Body)
}

// Policy says how a route treats Idempotency-Key.
type Policy struct {
	// Required: the key must be a token minted for this user by POST
	// /api/v1/idempotency-tokens, and a request without one is refused.
	// Otherwise the key is the client's choice, and optional.
	Required bool
	// RerunServerErrors: no 5xx is stored, so a retry runs the handler
	// again. Only for handlers that converge when run twice with one key,
	// because their own write records it (one order row per key; paying a
	// paid order answers the same). Otherwise a 500 is stored, as Stripe
	// does, since running again might repeat a write that landed.
	RerunServerErrors bool
}

// Middleware guards a route that requires a minted token: POST
// /api/v1/orders. It must run after auth's User middleware.
func (m *Idem) Middleware() gin.HandlerFunc {
	return m.Guard(Policy{Required: true, RerunServerErrors: true})
}

// Optional guards a money-moving route where the client may send a key of
// its own (deposit, withdraw, transfer, seckill purchase). It must run
// after auth's User middleware.
func (m *Idem) Optional() gin.HandlerFunc { return m.Guard(Policy{}) }

// Guard returns the middleware for p. It must run after auth's User
// middleware: keys belong to users.
func (m *Idem) Guard(p Policy) gin.HandlerFunc {
	return func(c *gin.Context) {
		key, present, err := headerKey(c.Request.Header.Values(KeyHeader), p.Required)
		switch {
		case err != nil:
			problem.Write(c, err)
			return
		case !present:
			c.Next()
			return
		}
		user := auth.UserID(c)
		body, err := keepBody(c.Request)
		if err != nil {
			problem.Write(c, err)
			return
		}
		fp := fingerprint(c.Request.Method, routePath(c), c.Request.URL.Query().Encode(), user, body)
		m.admit(c, p, user, key, fp)
	}
}

// routePath is the request's path as the handler reads it: the route's
// pattern with each parameter's value, an :id in its one decimal form
// (the handlers parse ids with strconv.ParseInt, so 01, +1 and 1 name one
// row; a SKU is a name, and 007 is not 7). Outside a route it is the
// escaped path.
func routePath(c *gin.Context) string {
	pattern := c.FullPath()
	if pattern == "" {
		return c.Request.URL.EscapedPath()
	}
	var b strings.Builder
	b.WriteString(pattern)
	for _, p := range c.Params {
		v := p.Value
		if n, err := strconv.ParseInt(v, 10, 64); err == nil && p.Key == "id" {
			v = strconv.FormatInt(n, 10)
		}
		b.WriteString("\x00" + p.Key + "=" + v)
	}
	return b.String()
}

// headerKey reads the request's one Idempotency-Key from values; present
// is false when there is none and p does not require one.
func headerKey(values []string, required bool) (key string, present bool, err error) {
	switch {
	case len(values) == 0 && required:
		return "", false, missing()
	case len(values) == 0:
		return "", false, nil
	case len(values) > 1:
		return "", false, invalid(fmt.Sprintf("send one Idempotency-Key header, not %d", len(values)))
	}
	key, err = parseKey(values[0])
	if err != nil {
		return "", false, invalid(err.Error())
	}
	return key, true, nil
}

// MaxKeyLength is the longest Idempotency-Key accepted, in characters
// (after unquoting), as Stripe and the draft's examples allow.
const MaxKeyLength = 255

// parseKey reads an Idempotency-Key value. It accepts the draft's form, a
// Structured Field string (`"…"`, printable ASCII with \" and \\ escaped),
// and Stripe's bare form (visible ASCII without '"' or ','; a comma would
// mean that two header lines were folded into one). The two spellings of
// one key are one key. It returns a detail for the 400 otherwise.
func parseKey(raw string) (string, error) {
	raw = strings.Trim(raw, " \t") // optional whitespace around a field value
	key := raw
	if strings.HasPrefix(raw, `"`) {
		var ok bool
		if key, ok = unquote(raw); !ok {
			return "", fmt.Errorf("the Idempotency-Key %.40q starts with a quote but is not a Structured Field string: printable ASCII, \\\" and \\\\ escaped, a closing quote", raw)
		}
	} else {
		for i := 0; i < len(key); i++ {
			switch c := key[i]; {
			case c > '~':
				// %q of one byte of a UTF-8 sequence prints another character.
				return "", fmt.Errorf("the Idempotency-Key has the non-ASCII byte %#x at byte %d; send visible ASCII without '\"' or ',', or quote it as a Structured Field string", c, i)
			case c <= ' ' || c == '"' || c == ',':
				return "", fmt.Errorf("the Idempotency-Key has %q at byte %d; send visible ASCII without '\"' or ',', or quote it as a Structured Field string", c, i)
			}
		}
	}
	switch {
	case strings.TrimSpace(key) == "":
		return "", fmt.Errorf("the Idempotency-Key is empty; send 1 to %d characters, or no header", MaxKeyLength)
	case len(key) > MaxKeyLength:
		return "", fmt.Errorf("the Idempotency-Key has %d characters; at most %d are accepted", len(key), MaxKeyLength)
	}
	return key, nil
}

// unquote parses a Structured Field string (RFC 8941 section 3.3.3).
func unquote(s string) (string, bool) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
			if i >= len(s) || (s[i] != '"' && s[i] != '\\') {
				return "", false
			}
			b.WriteByte(s[i])
		case c == '"':
			return b.String(), i == len(s)-1
		case c < ' ' || c > '~':
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return "", false // no closing quote
}

// keepBody reads r's body for the fingerprint and puts it back for the
// handler. A body over the route's limit is 413.
func keepBody(r *http.Request) ([]byte, error) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, problem.New(http.StatusRequestEntityTooLarge, "body-too-large",
				fmt.Sprintf("the body is larger than %d bytes", mbe.Limit))
		}
		return nil, err
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	return body, nil
}

// keyedRun is one request whose key Redis let it claim.
type keyedRun struct {
	policy           Policy
	user             int64
	key, fp          string
	run              string // the run number that fences the key's record in Redis
	claimed          time.Time
	recKey, leaseKey string
}

// admit claims key for the request: it runs, or is answered from the
// key's record, or is refused.
func (m *Idem) admit(c *gin.Context, p Policy, user int64, key, fp string) {
	claimed := time.Now() // Redis starts the lease later than this
	v, run, rec, err := m.claim(c.Request.Context(), user, key, fp, p.Required)
	switch {
	case err != nil:
		problem.Write(c, err)
	case v == unknownKey:
		m.unknownOrRecorded(c, user, key, fp)
	case v == inUse:
		problem.Write(c, inUseError())
	case v == decided && rec.status != 0 && rec.fp == fp:
		replay(c, rec)
	case v == decided:
		// Another request's response, or another request that ran
		// and crashed or failed half-way: the key is its.
		problem.Write(c, reused())
	default:
		c.Set(tokenKey, key)
		r := keyedRun{policy: p, user: user, key: key, fp: fp, run: run, claimed: claimed}
		r.recKey, r.leaseKey = m.keys(user, key)
		m.runOrReplay(c, r)
	}
}

// runOrReplay runs a request whose key Redis let it claim, unless the
// database holds the key's record: the first run's change committed and
// Redis lost its answer (a restart, a failover, a store that failed) or
// never had it (the commit's reply was lost, answered 503). Then the
// record answers, and Redis keeps it again.
func (m *Idem) runOrReplay(c *gin.Context, r keyedRun) {
	rec, found, err := m.lookup(c.Request.Context(), r.user, r.key)
	if err == nil && !found {
		m.run(c, r)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.Request.Context()), finishTimeout)
	defer cancel()
	switch {
	case err != nil:
		m.free(ctx, r)
		problem.Write(c, err)
	case rec.fp != r.fp:
		m.free(ctx, r)
		problem.Write(c, reused())
	default:
		if err := storeScript.Run(ctx, m.client, []string{r.recKey, r.leaseKey}, r.run, rec.fp, rec.status, rec.header, rec.body, rec.rid).Err(); err != nil {
			slog.WarnContext(ctx, "idem: copy the database's record to Redis", "key", r.recKey, "err", err)
		}
		replay(c, rec)
	}
}

// unknownOrRecorded answers a minted key that Redis does not know: with
// the record of the change it made, if the database has one (Redis lost
// the token after its change committed), or 422 idempotency-key-unknown.
func (m *Idem) unknownOrRecorded(c *gin.Context, user int64, key, fp string) {
	if !tokenPattern.MatchString(key) {
		problem.Write(c, unknown()) // never minted: no record to look for
		return
	}
	rec, found, err := m.lookup(c.Request.Context(), user, key)
	switch {
	case err != nil:
		problem.Write(c, err)
	case !found:
		problem.Write(c, unknown())
	case rec.fp != fp:
		problem.Write(c, reused())
	default:
		replay(c, rec)
	}
}

func titled(e *problem.Error, title string) *problem.Error { e.Title = title; return e }

func missing() error {
	return titled(problem.New(http.StatusBadRequest, "idempotency-key-missing",
		"send an Idempotency-Key header with a token from POST /api/v1/idempotency-tokens"), "Idempotency-Key missing")
}

func invalid(detail string) error {
	return titled(problem.New(http.StatusBadRequest, "idempotency-key-invalid", detail), "Idempotency-Key invalid")
}

func unknown() error {
	return titled(problem.New(http.StatusUnprocessableEntity, "idempotency-key-unknown",
		"the Idempotency-Key was not issued to you, has expired, or was lost before an order used it; get a new one from POST /api/v1/idempotency-tokens"), "Idempotency-Key unknown")
}

func reused() error {
	return titled(problem.New(http.StatusUnprocessableEntity, "idempotency-key-reused",
		"the Idempotency-Key was used for a different request (method, path or body); use a new key for a new request"), "Idempotency-Key reused")
}

const inUseDetail = "a request with this Idempotency-Key is still running; retry later to get its response"

func inUseError() error {
	e := titled(problem.New(http.StatusConflict, "idempotency-key-in-use", inUseDetail), "Idempotency-Key in use")
	e.RetryAfter = 1
	return e
}

func replay(c *gin.Context, rec record) {
	var h map[string]string
	if err := json.Unmarshal([]byte(rec.header), &h); err != nil {
		problem.Write(c, fmt.Errorf("idem: stored headers: %w", err))
		return
	}
	for k, v := range h {
		c.Writer.Header().Set(k, v)
	}
	c.Writer.Header().Set(ReplayedHeader, "true")
	if rec.rid != "" {
		c.Writer.Header().Set(ReplayedRequestIDHeader, rec.rid)
	}
	c.Writer.WriteHeader(rec.status)
	_, _ = c.Writer.WriteString(rec.body)
	c.Abort()
}

// stores reports whether a response with status is kept for retries.
func (p Policy) stores(c *gin.Context, status int) bool {
	if c.GetBool(noStoreKey) {
		return false
	}
	switch status {
	case http.StatusBadRequest, http.StatusRequestTimeout, http.StatusRequestEntityTooLarge,
		http.StatusUnsupportedMediaType, http.StatusTooManyRequests, http.StatusServiceUnavailable:
		return false
	}
	return status < 500 || !p.RerunServerErrors
}

// run calls the handler with a context that ends if the key's lease is lost
// (a duplicate may then run: the handler's own fences and uniqueness must
// hold the line), captures its response, and stores it or frees the key.
func (m *Idem) run(c *gin.Context, r keyedRun) {
	parent := c.Request.Context()
	w := &capture{ResponseWriter: c.Writer}
	c.Writer = w
	kr := &keyed.Run{User: r.user, Key: r.key, Fingerprint: r.fp, RequestID: w.Header().Get(problem.RequestIDHeader)}
	panicked, stack := leased(c, kr, m.lease(r.recKey, r.leaseKey, r.run, r.claimed), r)
	// The writes after the handler get their own time, from when it ends:
	// a handler may wait long for its locks.
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(parent), finishTimeout)
	defer fcancel()
	if panicked != nil {
		if r.policy.RerunServerErrors {
			m.free(fctx, r)
			c.Writer = w.ResponseWriter
			panic(panicked) // Recover, further out, answers 500
		}
		if panicked == http.ErrAbortHandler {
			defer panic(panicked) // after the store: net/http still cuts the connection
		}
		answerPanic(fctx, c, w, panicked, stack)
	}
	c.Writer = w.ResponseWriter
	// kr.Taken: another run of this key recorded its change first; this
	// one's 409 sends the client back for that run's answer.
	if !r.policy.stores(c, w.Status()) || w.overflow || kr.Taken {
		m.free(fctx, r)
		return
	}
	m.store(fctx, w, r)
}

// leased runs the rest of the chain for kr under lease, with a context
// that ends if the lease is lost, and returns what it panicked with.
// After leased, nothing renews the lease.
func leased(c *gin.Context, kr *keyed.Run, lease *runLease, r keyedRun) (panicked any, stack []byte) {
	parent := c.Request.Context()
	ctx, stop := lockkit.Watch(parent, lease)
	logLost := context.AfterFunc(ctx, func() {
		if errors.Is(context.Cause(ctx), lockkit.ErrLeaseLost) {
			slog.WarnContext(ctx, "idem: lease lost: "+lease.why(), "key", r.recKey, "run", r.run)
		}
	})
	defer logLost()
	c.Request = c.Request.WithContext(keyed.With(ctx, kr))
	panicked, stack = next(c)
	logLost()
	stop()
	lease.end(parent)
	return panicked, stack
}

// answerPanic logs a handler's panic and, unless the client was sent an
// answer already, answers 500 through the capture w, so that the key keeps
// what the client was sent: a panic may come after a write that landed,
// also one after the answer was sent or one that aborts the connection,
// and a retry must not run the handler again.
func answerPanic(ctx context.Context, c *gin.Context, w *capture, panicked any, stack []byte) {
	if panicked != http.ErrAbortHandler {
		slog.ErrorContext(ctx, "panic in handler", "request_id", w.Header().Get(problem.RequestIDHeader),
			"panic", panicked, "stack", string(stack))
	}
	if !w.Written() {
		problem.Write(c, errors.New("panic"))
	}
}

// free releases the key for a retry to run, unless a later run claimed it.
func (m *Idem) free(ctx context.Context, r keyedRun) {
	if err := releaseScript.Run(ctx, m.client, []string{r.recKey, r.leaseKey}, r.run).Err(); err != nil {
		// The lease expires on its own; the key is blocked until then.
		slog.WarnContext(ctx, "idem: free key", "key", r.recKey, "run", r.run, "err", err)
	}
}

// store keeps the response captured in w as the key's answer, unless a
// later run claimed the key.
func (m *Idem) store(ctx context.Context, w *capture, r keyedRun) {
	hj := keyed.HeaderJSON(w.Header())
	rid := w.Header().Get(problem.RequestIDHeader)
	status := w.Status()
	stored, err := storeScript.Run(ctx, m.client, []string{r.recKey, r.leaseKey}, r.run, r.fp, status, hj, w.body.Bytes(), rid).Int()
	switch {
	case err != nil:
		// The client has its answer; a retry once the lease expires runs
		// again, and the handler's own fences and uniqueness must catch it.
		slog.ErrorContext(ctx, "idem: store response", "key", r.recKey, "status", status, "err", err)
	case stored == 0:
		slog.WarnContext(ctx, "idem: response not stored: the key expired, or was claimed again after this request's lease lapsed",
			"key", r.recKey, "run", r.run, "status", status)
	}
}

// next runs the rest of the chain and returns what it panicked with.
func next(c *gin.Context) (panicked any, stack []byte) {
	defer func() {
		if panicked = recover(); panicked != nil {
			stack = debug.Stack()
		}
	}()
	c.Next()
	return nil, nil
}

// capture passes the response through and keeps a copy of the body.
type capture struct {
	gin.ResponseWriter
	body     bytes.Buffer
	overflow bool
}

func (w *capture) Write(b []byte) (int, error) {
	w.keep(b)
	return w.ResponseWriter.Write(b)
}

func (w *capture) WriteString(s string) (int, error) {
	w.keep([]byte(s))
	return w.ResponseWriter.WriteString(s)
}

func (w *capture) keep(b []byte) {
	if w.overflow || w.body.Len()+len(b) > maxStoredBody {
		w.overflow = true
		return
	}
	w.body.Write(b)
}

// Register adds POST /idempotency-tokens to api (which authenticates users).
func (m *Idem) Register(api *gin.RouterGroup) {
	api.POST("/idempotency-tokens", problem.NoBody(), problem.Handle(m.issue))
}

func (m *Idem) issue(c *gin.Context) error {
	t, err := m.Issue(c.Request.Context(), auth.UserID(c))
	var full *TokensExhaustedError
	if errors.As(err, &full) {
		e := titled(problem.New(http.StatusTooManyRequests, "idempotency-tokens-exhausted", full.Error()), "Idempotency tokens exhausted")
		e.RetryAfter = max(1, int(math.Ceil(full.RetryAfter.Seconds())))
		return e
	}
	if err != nil {
		return err
	}
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusCreated, t)
	return nil
}
