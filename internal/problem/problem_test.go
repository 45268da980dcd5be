package problem

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"
)

var (
	errDomain = errors.New("thing is broken")
	errSecret = errors.New("dial 10.0.0.7:6379: refused")
	errOther  = errors.New("other thing")
)

var table = Table{
	{Target: errDomain, Status: http.StatusConflict, Slug: "thing-broken", Title: "Thing broken"},
	{Target: errSecret, Status: http.StatusServiceUnavailable, Slug: "unavailable", Title: "Dependency unavailable",
		RetryAfter: 1, Detail: "a server is unreachable"},
	{Match: func(err error) bool { return strings.Contains(err.Error(), "other") }, Status: http.StatusGone,
		Slug: "gone", Title: "Gone"},
	// Never reached for errDomain: the first matching row decides.
	{Target: errDomain, Status: http.StatusTeapot, Slug: "late", Title: "Late"},
}

func TestFrom(t *testing.T) {
	for _, tc := range []struct {
		name       string
		table      Table
		err        error
		status     int
		slug       string
		detail     string
		retryAfter string
	}{
		{"mapped-wrapped", table, fmt.Errorf("%w: part 3", errDomain), 409, "thing-broken", "thing is broken: part 3", ""},
		{"detail-hides-message", table, fmt.Errorf("redis: %w", errSecret), 503, "unavailable", "unreachable", "1"},
		{"matched", table, fmt.Errorf("the %w", errOther), 410, "gone", "the other thing", ""},
		{"internal-hides-message", table, errors.New("pq: secret table missing"), 500, "internal", "request id", ""},
		{"made-here", table, BadRequest("quantity must be a positive integer, got -3"), 400, "invalid-input", "got -3", ""},
		{"made-here-without-table", nil, BadRequest("quantity must be a positive integer, got -3"), 400, "invalid-input", "got -3", ""},
		{"retry-made-here", nil, &Error{Status: 409, Slug: "in-use", Detail: "in use", RetryAfter: 2}, 409, "in-use", "in use", "2"},
		{"no-table-is-internal", nil, errDomain, 500, "internal", "request id", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, h := tc.table.From(tc.err)
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

// TestHandleAnswersThroughTheTable: a Handler's error is answered with the
// table Errors installed, also from a handler behind other middleware.
func TestHandleAnswersThroughTheTable(t *testing.T) {
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	r.Use(Errors(table), Recover())
	fail := func(err error) Handler { return func(*gin.Context) error { return err } }
	r.GET("/conflict", func(c *gin.Context) { c.Next() }, Handle(fail(fmt.Errorf("%w: part 3", errDomain))))
	r.GET("/busy", Handle(fail(errSecret)))
	r.GET("/ok", Handle(func(c *gin.Context) error { c.JSON(http.StatusOK, "fine"); return nil }))
	bare := gin.New()
	bare.GET("/conflict", Handle(fail(errDomain)))
	for _, tc := range []struct {
		name       string
		h          http.Handler
		path       string
		status     int
		body       string
		retryAfter string
	}{
		{"mapped-409", r, "/conflict", 409, `"detail":"thing is broken: part 3"`, ""},
		{"mapped-503", r, "/busy", 503, `"type":"` + TypeBase + `unavailable"`, "1"},
		{"ok-200", r, "/ok", 200, `"fine"`, ""},
		{"no-table-500", bare, "/conflict", 500, `"type":"` + TypeBase + `internal"`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			tc.h.ServeHTTP(rec, httptest.NewRequest("GET", tc.path, nil))
			if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.body) || rec.Header().Get("Retry-After") != tc.retryAfter {
				t.Fatalf("%d %v %s; want %d with %s", rec.Code, rec.Header(), rec.Body, tc.status, tc.body)
			}
			if rec.Code >= 400 && rec.Header().Get("Content-Type") != ContentType {
				t.Fatalf("Content-Type %q", rec.Header().Get("Content-Type"))
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
		{`{"n":1}`, "application/json; charset=latin1", 415, "charset"},
		{`{"N":1}`, "application/json", 400, `unknown field "N"; names are case-sensitive: "n"`},
		{``, "", 400, "body is empty"},
		{`{"n":"1"}`, "application/json", 400, "n must be an integer"},
		{`{"n":1e400}`, "application/json", 400, "got 1e400"},
		{`{"m":1}`, "application/json", 400, `unknown field "m"`},
		{`{"n":1}x`, "application/json", 400, "data after the JSON object"},
		{`{"n":1,"n":5}`, "application/json", 400, `member "n" appears twice`},
		{`{"n":1,"N":5}`, "application/json", 400, `member "N" appears twice`},
		{`{"n":1,"\u006e":5}`, "application/json", 400, `member "n" appears twice`},
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

// TestDecodeJSONRefusesTwoContentTypes: a request naming two media types
// is refused whichever comes first, as two Authorization or two
// Idempotency-Key headers are: either could be meant.
func TestDecodeJSONRefusesTwoContentTypes(t *testing.T) {
	for _, types := range [][]string{{"application/json", "text/plain"}, {"text/plain", "application/json"},
		{"application/json", "application/json"}} {
		gin.SetMode(gin.ReleaseMode)
		r := gin.New()
		var got error
		r.POST("/", func(c *gin.Context) { var v struct{ N int }; got = DecodeJSON(c, &v) })
		rq := httptest.NewRequest("POST", "/", strings.NewReader(`{"N":1}`))
		for _, ct := range types {
			rq.Header.Add("Content-Type", ct)
		}
		r.ServeHTTP(httptest.NewRecorder(), rq)
		var pe *Error
		if !errors.As(got, &pe) || pe.Status != 415 || !strings.Contains(pe.Detail, "two Content-Type") {
			t.Errorf("Content-Type %q: %v, want 415 naming the two", types, got)
		}
	}
}

// TestDecodeJSONRefusesAContentCoding: a compressed body is refused for
// what it is (415 naming the coding), not parsed as broken JSON.
func TestDecodeJSONRefusesAContentCoding(t *testing.T) {
	for coding, status := range map[string]int{"gzip": 415, "br, gzip": 415, "identity": 0, "": 0} {
		gin.SetMode(gin.ReleaseMode)
		r := gin.New()
		var got error
		r.POST("/", func(c *gin.Context) { var v struct{ N int }; got = DecodeJSON(c, &v) })
		rq := httptest.NewRequest("POST", "/", strings.NewReader(`{"N":1}`))
		rq.Header.Set("Content-Type", "application/json")
		if coding != "" {
			rq.Header.Set("Content-Encoding", coding)
		}
		r.ServeHTTP(httptest.NewRecorder(), rq)
		var pe *Error
		switch {
		case status == 0 && got != nil:
			t.Errorf("Content-Encoding %q: %v, want accepted", coding, got)
		case status != 0 && (!errors.As(got, &pe) || pe.Status != status || !strings.Contains(pe.Detail, "Content-Encoding")):
			t.Errorf("Content-Encoding %q: %v, want %d naming the coding", coding, got, status)
		}
	}
}

func TestDecodeJSONRefusesRepeatedMemberOfNestedObject(t *testing.T) {
	type req struct {
		M map[string]any `json:"m"`
	}
	gin.SetMode(gin.ReleaseMode)
	r := gin.New()
	var got error
	r.POST("/", func(c *gin.Context) { var v req; got = DecodeJSON(c, &v) })
	rq := httptest.NewRequest("POST", "/", strings.NewReader(`{"m":{"a":1,"b":[{"a":1}],"a":2}}`))
	rq.Header.Set("Content-Type", "application/json")
	r.ServeHTTP(httptest.NewRecorder(), rq)
	var pe *Error
	if !errors.As(got, &pe) || pe.Status != 400 || !strings.Contains(pe.Detail, `member "a" appears twice in /m`) {
		t.Fatalf("got %v, want 400 naming the repeated member and its object", got)
	}
	if len(pe.Fields) != 1 || pe.Fields[0].Pointer != "/m/a" {
		t.Errorf("errors %+v, want one at /m/a", pe.Fields)
	}
}

// TestReadBodyRunsTheHandlerOnlyWithTheWholeBody: the handlers after
// ReadBody run once the body is in memory, with its length known however
// it was framed; a body over the cap is answered 413 before they run.
func TestReadBodyRunsTheHandlerOnlyWithTheWholeBody(t *testing.T) {
	gin.SetMode(gin.TestMode)
	for _, tc := range []struct {
		name, body string
		status     int
		length     int64
	}{
		{"fits", `{"a":1}`, http.StatusOK, 7},
		{"empty", "", http.StatusOK, 0},
		{"over-the-cap", strings.Repeat("x", 65), http.StatusRequestEntityTooLarge, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := gin.New()
			r.Use(LimitBody(64), ReadBody())
			var length int64 = -2
			r.POST("/", func(c *gin.Context) { length = c.Request.ContentLength; c.Status(http.StatusOK) })
			rq := httptest.NewRequest("POST", "/", strings.NewReader(tc.body))
			rq.ContentLength = -1 // chunked: the length is not known up front
			rec := httptest.NewRecorder()
			r.ServeHTTP(rec, rq)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if tc.status == http.StatusOK && length != tc.length {
				t.Errorf("the handler saw ContentLength %d, want %d", length, tc.length)
			}
			if tc.status != http.StatusOK && length != -2 {
				t.Errorf("the handler ran on a refused body")
			}
		})
	}
}

// TestQueryRefusesAQueryThatDoesNotParse: net/url drops a pair it cannot
// read (a bad escape, a semicolon) in silence, so ?limit=%zz would be
// served as no limit at all; the request is refused instead, naming it.
func TestQueryRefusesAQueryThatDoesNotParse(t *testing.T) {
	for query, status := range map[string]int{"": 200, "limit=2": 200, "limit=2&cursor=x": 200,
		"limit=%zz": 400, "limit=1;x": 400, "limit=2&cursor=%zz": 400} {
		gin.SetMode(gin.ReleaseMode)
		r := gin.New()
		r.Use(Query())
		r.GET("/", func(c *gin.Context) { c.Status(http.StatusOK) })
		rec := httptest.NewRecorder()
		r.ServeHTTP(rec, httptest.NewRequest("GET", "/?"+query, nil))
		if rec.Code != status {
			t.Errorf("?%s: %d, want %d", query, rec.Code, status)
		}
		if status == 400 && !strings.Contains(rec.Body.String(), "query string") {
			t.Errorf("?%s: %s, want a detail naming the query string", query, rec.Body.String())
		}
	}
}
