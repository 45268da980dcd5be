// Package problem turns errors into RFC 9457 problem details
// (application/problem+json), the only error format shop answers with.
//
// Handlers return errors (Handler, adapted to gin by Handle); one Table,
// handed to the router at wiring time (Errors), maps them to problems:
//
//	{Target: inventory.ErrSoldOut, Status: http.StatusConflict, Slug: "sold-out", Title: "Sold out"}
//
// The first row an error matches decides, and the error's message is the
// detail, so wrap sentinels with a message meant for the client:
// fmt.Errorf("%w: 3 left, 5 asked", ErrSoldOut). Errors no row matches are
// internal: the client gets a generic 500 and the log gets the error.
package problem

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/gin-gonic/gin"
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
	// Errors is an extension member: every invalid field of the body.
	Errors Fields `json:"errors,omitempty"`
}

// Error is a problem made on the spot, for failures that are not a domain
// sentinel: bad input, authentication, routing. Its message is the detail.
// It needs no row in the Table.
type Error struct {
	Status int
	Slug   string // the anchor of Type; the title is derived from the status when empty
	Title  string
	Detail string
	// RetryAfter, in seconds, is sent as the Retry-After header when > 0.
	RetryAfter int
	// Header is added to the response (e.g. WWW-Authenticate).
	Header http.Header
	// Fields are the invalid members of the body, each in the problem's
	// errors member.
	Fields Fields
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

// Mapping is one row of a Table: the errors it matches are answered with
// its status, type, title and Retry-After.
type Mapping struct {
	// Target matches every error that errors.Is it.
	Target error
	// Match, when set, replaces Target: for a class of errors no one
	// sentinel names (a broken connection, whatever the driver).
	Match func(error) bool

	Status int
	Slug   string
	Title  string
	// Detail, when set, replaces the error's message: used where the
	// message is written for programmers or may carry internals
	// (addresses, driver text).
	Detail string
	// RetryAfter, in seconds, is sent as the Retry-After header when > 0.
	RetryAfter int
}

func (m Mapping) matches(err error) bool {
	if m.Match != nil {
		return m.Match(err)
	}
	return errors.Is(err, m.Target)
}

// Table maps errors to problems; the first matching row decides. The zero
// Table knows only *Error: everything else is an internal error.
type Table []Mapping

// From turns err into the problem details and headers to answer with. It
// never returns the message of an error whose row does not allow it.
func (t Table) From(err error) (Details, http.Header) {
	h := http.Header{}
	var pe *Error
	if errors.As(err, &pe) {
		for k, v := range pe.Header {
			h[k] = v
		}
		if pe.RetryAfter > 0 {
			h.Set("Retry-After", strconv.Itoa(pe.RetryAfter))
		}
		d := details(pe.Status, pe.Slug, pe.Title, pe.Detail)
		d.Errors = pe.Fields
		return d, h
	}
	for _, m := range t {
		if !m.matches(err) {
			continue
		}
		detail := err.Error()
		if m.Detail != "" {
			detail = m.Detail
		}
		if m.RetryAfter > 0 {
			h.Set("Retry-After", strconv.Itoa(m.RetryAfter))
		}
		return details(m.Status, m.Slug, m.Title, detail), h
	}
	return details(internal.Status, internal.Slug, internal.Title, internal.Detail), h
}

// internal answers every error no row matches: its message, which may
// carry anything, stays in the log.
var internal = Mapping{Status: http.StatusInternalServerError, Slug: "internal", Title: "Internal error",
	Detail: "the server failed to handle this request; the request id identifies it in the logs"}

const (
	tableKey = "problem.table"
	slugKey  = "problem.slug"
)

// SlugOf is the slug of the problem c was answered with, "" if none: what
// the metrics tell apart (a 503 lock-busy is shed load, a 503
// outcome-unknown an error).
func SlugOf(c *gin.Context) string { return c.GetString(slugKey) }

// Errors makes t the table by which Write, and so every Handler, answers
// the request's errors. The router installs it before any handler that
// may fail.
func Errors(t Table) gin.HandlerFunc {
	return func(c *gin.Context) {
		c.Set(tableKey, t)
		c.Next()
	}
}

// Handler is a gin handler that returns its failure instead of answering
// it.
type Handler func(*gin.Context) error

// Handle adapts h to gin: an error h returns is answered by Write.
func Handle(h Handler) gin.HandlerFunc {
	return func(c *gin.Context) {
		if err := h(c); err != nil {
			Write(c, err)
		}
	}
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

// Write answers c with err as problem+json, mapped by the table Errors
// installed, and aborts the handler chain. 5xx other than 503 are logged
// with the error, which the body never shows. Middleware, which cannot
// return an error, calls Write; handlers return theirs to Handle.
func Write(c *gin.Context, err error) {
	installed, _ := c.Get(tableKey)
	t, _ := installed.(Table)
	d, h := t.From(err)
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
	c.Set(slugKey, strings.TrimPrefix(d.Type, TypeBase))
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
			Write(c, errors.New("panic")) // matches no row: a generic 500
		}()
		c.Next()
	}
}
