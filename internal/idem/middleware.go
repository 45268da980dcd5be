package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/lockbench/shop/internal/auth"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/problem"
)

// storedHeaders are the response headers a replay sends again. Others
// (Date, X-Request-Id, Retry-After) belong to the answer they were sent with.
var storedHeaders = []string{"Content-Type", "Location", "Cache-Control"}

// maxStoredBody caps what is kept per token; a larger response is sent but
// not stored, and the token is freed.
const maxStoredBody = 1 << 20

// finishTimeout bounds the writes after the handler, which run detached
// from the request: a response sent must be stored even if the client left.
const finishTimeout = 5 * time.Second

const (
	noStoreKey = "idem.nostore"
	tokenKey   = "idem.token"
)

// Key is the idempotency token of a request the middleware let through, for
// handlers that record it (an order row keeps it, unique per user).
func Key(c *gin.Context) string { return c.GetString(tokenKey) }

// DoNotStore marks the response being written as one a retry must not get
// again: e.g. "an earlier attempt is still in progress". The token is freed.
func DoNotStore(c *gin.Context) { c.Set(noStoreKey, true) }

func stored(c *gin.Context, status int) bool {
	if c.GetBool(noStoreKey) {
		return false
	}
	switch status {
	case http.StatusBadRequest, http.StatusRequestTimeout, http.StatusRequestEntityTooLarge,
		http.StatusUnsupportedMediaType, http.StatusTooManyRequests:
		return false
	}
	return status < 500
}

func titled(e *problem.Error, title string) *problem.Error { e.Title = title; return e }

func missing() error {
	return titled(problem.New(http.StatusBadRequest, "idempotency-key-missing",
		"send an Idempotency-Key header with a token from POST /api/v1/idempotency-tokens"), "Idempotency-Key missing")
}

func unknown() error {
	return titled(problem.New(http.StatusUnprocessableEntity, "idempotency-key-unknown",
		"the Idempotency-Key was not issued to you or has expired; get a new one from POST /api/v1/idempotency-tokens"), "Idempotency-Key unknown")
}

func reused() error {
	return titled(problem.New(http.StatusUnprocessableEntity, "idempotency-key-reused",
		"the Idempotency-Key was used for a different request (method, path or body); use a new token for a new request"), "Idempotency-Key reused")
}

func inUse() error {
	e := titled(problem.New(http.StatusConflict, "idempotency-key-in-use",
		"a request with this Idempotency-Key is still running; retry later to get its response"), "Idempotency-Key in use")
	e.RetryAfter = 1
	return e
}

// Middleware enforces Idempotency-Key on the routes it guards. It must run
// after auth's User middleware: tokens belong to users.
func (m *Idem) Middleware() gin.HandlerFunc {
	return func(c *gin.Context) {
		raw := c.GetHeader(KeyHeader)
		if raw == "" {
			problem.Write(c, missing())
			return
		}
		token, user := parseKey(raw), auth.UserID(c)
		body, err := io.ReadAll(c.Request.Body)
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				problem.Write(c, problem.New(http.StatusRequestEntityTooLarge, "body-too-large",
					fmt.Sprintf("the body is larger than %d bytes", mbe.Limit)))
				return
			}
			problem.Write(c, err)
			return
		}
		c.Request.Body = io.NopCloser(bytes.NewReader(body))
		fp := fingerprint(c.Request.Method, c.Request.URL.RequestURI(), body)

		ctx := c.Request.Context()
		rec, err := m.load(ctx, user, token)
		if m.answered(c, rec, fp, err) {
			return
		}
		lease, err := m.o.Locker.TryAcquire(ctx, LockKey(user, token), m.o.LockOptions...)
		if errors.Is(err, lockkit.ErrNotAcquired) {
			if rec.fp != "" && rec.fp != fp {
				problem.Write(c, reused())
				return
			}
			problem.Write(c, inUse())
			return
		}
		if err != nil {
			problem.Write(c, err)
			return
		}
		defer func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishTimeout)
			defer cancel()
			_ = lease.Release(rctx) // if it expired meanwhile, there is nothing left to free
		}()
		// One round trip under the lock: the record is read again (the first
		// request may have finished between the read above and the grant)
		// and, if nothing decides the answer, bound to this request.
		rec, claimed, err := m.claim(ctx, user, token, fp)
		if !claimed {
			if !m.answered(c, rec, fp, err) {
				// An earlier request with another body ran and crashed or
				// failed half-way: the token is its, not this request's.
				problem.Write(c, reused())
			}
			return
		}
		c.Set(tokenKey, token)
		m.run(c, lease, user, token, fp)
	}
}

// answered writes the response a token's state decides without running the
// handler: an error, a replay, or a mismatch. It returns false when the
// request should run.
func (m *Idem) answered(c *gin.Context, rec record, fp string, err error) bool {
	switch {
	case errors.Is(err, ErrUnknownKey):
		problem.Write(c, unknown())
	case err != nil:
		problem.Write(c, err)
	case rec.status == 0:
		return false
	case rec.fp != fp:
		problem.Write(c, reused())
	default:
		replay(c, rec)
	}
	return true
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
	c.Writer.WriteHeader(rec.status)
	_, _ = c.Writer.WriteString(rec.body)
	c.Abort()
}

// run calls the handler with a context that ends if the lease is lost (a
// duplicate may then run: the handler's own uniqueness must hold the line),
// captures its response, and stores it or frees the token.
func (m *Idem) run(c *gin.Context, lease lockkit.Lease, user int64, token, fp string) {
	parent := c.Request.Context()
	ctx, cancel := context.WithCancelCause(parent)
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		select {
		case <-lease.Lost():
			cancel(lockkit.ErrLeaseLost)
		case <-ctx.Done():
		}
	}()
	fctx, fcancel := context.WithTimeout(context.WithoutCancel(parent), finishTimeout)
	defer fcancel()
	k := m.key(user, token)
	w := &capture{ResponseWriter: c.Writer}
	c.Writer = w
	c.Request = c.Request.WithContext(ctx)
	defer func() {
		cancel(nil)
		<-watchDone
		c.Writer = w.ResponseWriter
		if rec := recover(); rec != nil {
			// Recover, further out, answers 500: a retry may run again.
			_ = unclaimScript.Run(fctx, m.client, []string{k}).Err()
			panic(rec)
		}
	}()
	c.Next()

	status := w.Status()
	if !stored(c, status) || w.overflow {
		if err := unclaimScript.Run(fctx, m.client, []string{k}).Err(); err != nil {
			slog.WarnContext(fctx, "idem: free token", "key", LockKey(user, token), "err", err)
		}
		return
	}
	header := map[string]string{}
	for _, name := range storedHeaders {
		if v := w.Header().Get(name); v != "" {
			header[name] = v
		}
	}
	hj, _ := json.Marshal(header)
	if err := storeScript.Run(fctx, m.client, []string{k}, fp, status, hj, w.body.Bytes()).Err(); err != nil {
		// The client has its answer; a retry will run again, and the
		// handler's own uniqueness (e.g. one order per key) must catch it.
		slog.ErrorContext(fctx, "idem: store response", "key", LockKey(user, token), "status", status, "err", err)
	}
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
	api.POST("/idempotency-tokens", m.issue)
}

func (m *Idem) issue(c *gin.Context) {
	t, err := m.Issue(c.Request.Context(), auth.UserID(c))
	if err != nil {
		problem.Write(c, err)
		return
	}
	c.Header("Cache-Control", "no-store")
	c.JSON(http.StatusCreated, t)
}
