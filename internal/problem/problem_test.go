package problem

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
	"github.com/go-sql-driver/mysql"

	"github.com/lockbench/shop/internal/lockkit"
)

var errDomain = errors.New("thing is broken")

func TestFrom(t *testing.T) {
	Register(errDomain, http.StatusConflict, "thing-broken", "Thing broken")
	for _, tc := range []struct {
		name       string
		err        error
		status     int
		slug       string
		detail     string
		retryAfter string
	}{
		{"registered-wrapped", fmt.Errorf("%w: part 3", errDomain), 409, "thing-broken", "thing is broken: part 3", ""},
		{"fenced", fmt.Errorf("account 1: %w", lockkit.ErrFenced), 503, "fenced", "stale write was refused", "1"},
		{"busy", lockkit.ErrNotAcquired, 503, "lock-busy", "wait timeout", "1"},
		{"unavailable-hides-address", fmt.Errorf("%w: dial 10.0.0.7:6379", lockkit.ErrUnavailable), 503, "unavailable", "unreachable", "1"},
		{"net-error", &net.OpError{Op: "dial", Err: errors.New("refused")}, 503, "unavailable", "unreachable", "1"},
		// A statement whose connection MariaDB closed before the reply, as
		// it stopped: seen in make faults, TestLockServerRestart, from the
		// account store, which passes gorm's errors up unwrapped. It may
		// have committed, so it is neither unavailable (nothing changed)
		// nor internal; and no Retry-After.
		{"mysql-reply-lost", fmt.Errorf("deposit: %w", mysql.ErrInvalidConn), 503, "outcome-unknown", "may or may not have been applied", ""},
		{"mysql-statement-error", &mysql.MySQLError{Number: 1146, Message: "Table 'secret' doesn't exist"}, 500, "internal", "request id", ""},
		{"internal-hides-message", errors.New("pq: secret table missing"), 500, "internal", "request id", ""},
		{"made-here", BadRequest("quantity must be a positive integer, got -3"), 400, "invalid-input", "got -3", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, h := From(tc.err)
			if d.Status != tc.status || d.Type != TypeBase+tc.slug || !strings.Contains(d.Detail, tc.detail) ||
				h.Get("Retry-After") != tc.retryAfter || d.Title == "" {
				t.Errorf("From(%v) = %+v, Retry-After %q", tc.err, d, h.Get("Retry-After"))
			}
			if strings.Contains(d.Detail, "secret") || strings.Contains(d.Detail, "10.0.0.7") {
				t.Errorf("detail leaks internals: %q", d.Detail)
			}
		})
	}
}

func TestPanicIsA500Problem(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(Recover())
	r.GET("/boom", func(*gin.Context) { panic("boom") })
	rec := httptest.NewRecorder()
	r.ServeHTTP(rec, httptest.NewRequest("GET", "/boom", nil))
	var d Details
	if rec.Code != 500 || rec.Header().Get("Content-Type") != ContentType || json.Unmarshal(rec.Body.Bytes(), &d) != nil || d.Status != 500 {
		t.Errorf("%d %v %s", rec.Code, rec.Header(), rec.Body)
	}
}

func TestDecodeJSON(t *testing.T) {
	type req struct {
		N *int64 `json:"n"`
	}
	for _, tc := range []struct {
		body, ctype string
		status      int
		detail      string
	}{
		{`{"n":1}`, "application/json", 0, ""},
		{`{"n":1}`, "application/json; charset=utf-8", 0, ""},
		{`{"n":1}`, "text/plain", 415, "send application/json"},
		{`{"n":1}`, "", 415, "but no Content-Type; send application/json"},
		{``, "", 400, "body is empty"},
		{`{"n":"1"}`, "application/json", 400, "n must be an integer"},
		{`{"n":1e400}`, "application/json", 400, "got 1e400"},
		{`{"m":1}`, "application/json", 400, `unknown field "m"`},
		{`{"n":1}x`, "application/json", 400, "data after the JSON object"},
		{`{"n":`, "application/json", 400, "ends in the middle"},
		{``, "application/json", 400, "body is empty"},
		{`{"n":1,"pad":"` + strings.Repeat("x", 100) + `"}`, "application/json", 413, "larger than 64 bytes"},
	} {
		gin.SetMode(gin.ReleaseMode)
		r := gin.New()
		r.Use(LimitBody(64))
		var got error
		r.POST("/", func(c *gin.Context) { var v req; got = DecodeJSON(c, &v) })
		rq := httptest.NewRequest("POST", "/", strings.NewReader(tc.body))
		if tc.ctype != "" {
			rq.Header.Set("Content-Type", tc.ctype)
		}
		r.ServeHTTP(httptest.NewRecorder(), rq)
		if tc.status == 0 {
			if got != nil {
				t.Errorf("%s: %v", tc.body, got)
			}
			continue
		}
		var pe *Error
		if !errors.As(got, &pe) || pe.Status != tc.status || !strings.Contains(pe.Detail, tc.detail) {
			t.Errorf("%q: %v, want %d %q", tc.body, got, tc.status, tc.detail)
		}
	}
}
