// Package problem turns errors into RFC 9457 problem details
// (application/problem+json), the only error format shop answers with.
//
// Domain packages keep plain sentinel errors and map each one to a status in
// one line, next to their handlers:
//
//	problem.Register(inventory.ErrSoldOut, http.StatusConflict, "sold-out", "Sold out")
//
// Write then finds the first registered error in the chain (errors.Is) and
// uses the error's message as the detail, so wrap sentinels with a message
// meant for the client: fmt.Errorf("%w: 3 left, 5 asked", ErrSoldOut).
// Errors nobody registered are internal: the client gets a generic 500 and
// the log gets the error.
package problem

import (
	"context"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"

	"github.com/gin-gonic/gin"
	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
)

// ContentType is the media type of every error body.
const ContentType = "application/problem+json"

// TypeBase prefixes every problem type: the docs have one anchor per type,
// so a client following the URI lands on its explanation.
const TypeBase = "https://github.com/lockbench/shop/blob/main/docs/api.md#"

// RequestIDHeader carries the request id; Write copies it into the body.
const RequestIDHeader = "X-Request-Id"

// Details is the body of an error response (RFC 9457 section 3).
type Details struct {
	Type     string `json:"type"`
	Title    string `json:"title"`
	Status   int    `json:"status"`
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	// RequestID is an extension member: the id to quote to an operator,
	// found in the logs of the instance that answered.
	RequestID string `json:"request_id,omitempty"`
}

// Error is a problem made on the spot, for failures that are not a domain
// sentinel: bad input, authentication, routing. Its message is the detail.
type Error struct {
	Status int
	Slug   string // the anchor of Type; the title is derived from the status when empty
	Title  string
	Detail string
	// RetryAfter, in seconds, is sent as the Retry-After header when > 0.
	RetryAfter int
	// Header is added to the response (e.g. WWW-Authenticate).
	Header http.Header
}

func (e *Error) Error() string { return e.Detail }

// New returns an *Error with the given status, type slug and detail.
func New(status int, slug, detail string) *Error {
	return &Error{Status: status, Slug: slug, Detail: detail}
}

// BadRequest is the 400 for input that is well-formed JSON but wrong.
func BadRequest(detail string) *Error {
	return &Error{Status: http.StatusBadRequest, Slug: "invalid-input", Title: "Invalid input", Detail: detail}
}

type mapping struct {
	target     error
	status     int
	slug       string
	title      string
	retryAfter int
	// generic, if set, replaces the error's message: used where the message
	// may carry internals (addresses, driver text).
	generic string
}

var (
	mu       sync.RWMutex
	registry []mapping
)

// Register maps every error that matches target (errors.Is) to status, with
// a type URI ending in slug and a short human title. The error's message is
// the detail, so it must be fit for the client. A later registration of the
// same target replaces the earlier one.
func Register(target error, status int, slug, title string) {
	add(mapping{target: target, status: status, slug: slug, title: title})
}

// RegisterRetry is Register for a transient failure: the response carries
// Retry-After: seconds.
func RegisterRetry(target error, status int, slug, title string, seconds int) {
	add(mapping{target: target, status: status, slug: slug, title: title, retryAfter: seconds})
}

func add(m mapping) {
	mu.Lock()
	defer mu.Unlock()
	for i := range registry {
		if registry[i].target == m.target {
			registry[i] = m
			return
		}
	}
	registry = append(registry, m)
}

// ErrShuttingDown is the cause with which shutdown cancels the requests
// that outlived SHOP_SHUTDOWN_TIMEOUT: their transactions roll back, and
// the client is told to retry elsewhere.
var ErrShuttingDown = errors.New("this instance is shutting down")

func init() {
	add(mapping{target: ErrShuttingDown, status: http.StatusServiceUnavailable, slug: "shutting-down",
		title: "Shutting down", retryAfter: 1, generic: "this instance is shutting down and stopped the request before it finished; retry it"})
	// A lock held by someone else for longer than the wait timeout, or a
	// lease lost before the write: the request changed nothing, the same
	// request will most likely succeed in a moment, and the cause is on the
	// server side (contention, a slow holder), not in what the client sent.
	// 503 + Retry-After says exactly that; 409 would tell the client that
	// its request conflicts with the resource's state, and that a retry is
	// pointless until the client changes something.
	RegisterRetry(lockkit.ErrNotAcquired, http.StatusServiceUnavailable, "lock-busy", "Lock busy", 1)
	RegisterRetry(lockkit.ErrLeaseLost, http.StatusServiceUnavailable, "lease-lost", "Lock lease lost", 1)
	RegisterRetry(lockkit.ErrFenced, http.StatusServiceUnavailable, "fenced", "Write refused: stale lock", 1)
	add(mapping{target: lockkit.ErrUnavailable, status: http.StatusServiceUnavailable, slug: "unavailable",
		title: "Dependency unavailable", retryAfter: 1, generic: "the lock server is unreachable; nothing was changed"})
	add(mapping{target: lockkit.ErrClosed, status: http.StatusServiceUnavailable, slug: "shutting-down",
		title: "Shutting down", retryAfter: 1, generic: "this instance is shutting down; nothing was changed"})
}

// details of lockkit errors are their messages, which are written for
// programmers; these say what happened to the client's request.
var lockDetails = map[error]string{
	lockkit.ErrNotAcquired: "the lock this request needs stayed busy for the whole wait timeout; nothing was changed",
	lockkit.ErrLeaseLost:   "this request's lock lease ended before its write; nothing was changed",
	lockkit.ErrFenced:      "this request's lock lease expired and a later holder wrote first; the stale write was refused and nothing was changed",
}

// From turns err into the problem details and headers to answer with. It
// never returns the message of an unregistered error.
func From(err error) (Details, http.Header) {
	h := http.Header{}
	var pe *Error
	if errors.As(err, &pe) {
		for k, v := range pe.Header {
			h[k] = v
		}
		if pe.RetryAfter > 0 {
			h.Set("Retry-After", strconv.Itoa(pe.RetryAfter))
		}
		return details(pe.Status, pe.Slug, pe.Title, pe.Detail), h
	}
	mu.RLock()
	defer mu.RUnlock()
	for _, m := range registry {
		if !errors.Is(err, m.target) {
			continue
		}
		detail := err.Error()
		if d, ok := lockDetails[m.target]; ok {
			detail = d
		}
		if m.generic != "" {
			detail = m.generic
		}
		if m.retryAfter > 0 {
			h.Set("Retry-After", strconv.Itoa(m.retryAfter))
		}
		return details(m.status, m.slug, m.title, detail), h
	}
	switch {
	case errors.Is(err, mysql.ErrInvalidConn):
		// The driver sent a statement and the connection broke before the
		// reply: a COMMIT may have landed (seen in TestLockServerRestart:
		// a deposit answered so was in the balance). Neither "nothing was
		// changed" nor a bug; and no Retry-After, which would invite a
		// blind retry of a change that may have been applied.
		return details(http.StatusServiceUnavailable, "outcome-unknown", "Outcome unknown",
			"the database connection broke before it confirmed this request's change, which may or may not have been applied; read the resource before retrying, or retry with the same Idempotency-Key"), h
	case unreachable(err):
		h.Set("Retry-After", "1")
		return details(http.StatusServiceUnavailable, "unavailable", "Dependency unavailable",
			"a server this request needs is unreachable; nothing was changed"), h
	case errors.Is(err, context.DeadlineExceeded):
		h.Set("Retry-After", "1")
		return details(http.StatusServiceUnavailable, "timeout", "Timed out",
			"the request ran out of time before it could finish"), h
	case errors.Is(err, context.Canceled):
		// The client went away, or the server is stopping: nobody reads
		// this, but the log and the metrics should not call it a 500.
		return details(http.StatusServiceUnavailable, "cancelled", "Cancelled",
			"the request was cancelled before it finished"), h
	}
	return details(http.StatusInternalServerError, "internal", "Internal error",
		"the server failed to handle this request; the request id identifies it in the logs"), h
}

// unreachable reports a connection-level failure to a backing server: the
// lock backend or the database when it does not wrap ErrUnavailable itself.
func unreachable(err error) bool {
	var opErr *net.OpError
	var dnsErr *net.DNSError
	return errors.As(err, &opErr) || errors.As(err, &dnsErr) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, driver.ErrBadConn) || errors.Is(err, redis.ErrClosed)
}

func details(status int, slug, title, detail string) Details {
	if slug == "" {
		slug = "http-" + strconv.Itoa(status)
	}
	if title == "" {
		title = http.StatusText(status)
	}
	return Details{Type: TypeBase + slug, Title: title, Status: status, Detail: detail}
}

// Write answers c with err as problem+json and aborts the handler chain.
// 5xx other than 503 are logged with the error, which the body never shows.
func Write(c *gin.Context, err error) {
	d, h := From(err)
	for k, v := range h {
		c.Writer.Header()[k] = v
	}
	if d.Status >= 500 {
		level := slog.LevelError
		if d.Status == http.StatusServiceUnavailable {
			level = slog.LevelWarn
		}
		// The request id comes with the context (the service's log handler
		// adds it to every line of a request).
		slog.Log(c.Request.Context(), level, "request failed", "status", d.Status, "err", err)
	}
	_ = c.Error(err) // for the request log
	Render(c, d)
}

// Render writes d as the response and aborts the handler chain.
func Render(c *gin.Context, d Details) {
	d.Instance = c.Request.URL.Path
	d.RequestID = c.Writer.Header().Get(RequestIDHeader)
	c.Header("Cache-Control", "no-store")
	// PureJSON: a detail such as "send Authorization: Bearer <token>" is
	// meant to be read, and this body is never embedded in HTML.
	c.Abort()
	c.Render(d.Status, problemJSON{d})
}

// problemJSON renders like gin's PureJSON, with the problem media type.
type problemJSON struct{ d Details }

func (p problemJSON) Render(w http.ResponseWriter) error {
	p.WriteContentType(w)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	return enc.Encode(p.d)
}

func (problemJSON) WriteContentType(w http.ResponseWriter) {
	w.Header().Set("Content-Type", ContentType)
}

// NoRoute answers 404 for paths no route matches.
func NoRoute(c *gin.Context) {
	Write(c, New(http.StatusNotFound, "not-found", "no route "+c.Request.URL.Path))
}

// NoMethod answers 405 for a path that exists with another method. gin
// sets the Allow header before calling it.
func NoMethod(c *gin.Context) {
	Write(c, New(http.StatusMethodNotAllowed, "method-not-allowed",
		c.Request.Method+" is not allowed on "+c.Request.URL.Path+"; allowed: "+c.Writer.Header().Get("Allow")))
}

// Recover turns a panic in a handler into a logged 500 problem, so that one
// bad request never kills the process or answers with an empty body.
// http.ErrAbortHandler is re-panicked: it is net/http's way to cut a response.
func Recover() gin.HandlerFunc {
	return func(c *gin.Context) {
		defer func() {
			rec := recover()
			if rec == nil {
				return
			}
			if rec == http.ErrAbortHandler {
				panic(rec)
			}
			slog.ErrorContext(c.Request.Context(), "panic in handler", "panic", rec, "stack", string(debug.Stack()))
			if c.Writer.Written() {
				return // too late for a problem body
			}
			Write(c, errors.New("panic")) // unregistered: a generic 500
		}()
		c.Next()
	}
}
