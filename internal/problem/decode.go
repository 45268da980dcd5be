package problem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
)

// LimitBody caps every request body at n bytes; a handler reading more gets
// an *http.MaxBytesError, which DecodeJSON answers with 413.
func LimitBody(n int64) gin.HandlerFunc {
	return func(c *gin.Context) {
		if c.Request.Body != nil {
			c.Request.Body = http.MaxBytesReader(c.Writer, c.Request.Body, n)
		}
		c.Next()
	}
}

// ReadBody reads the whole request body (within LimitBody's cap) before
// the handlers after it run, so that they start only once the client has
// sent it: a slow or idle client then waits alone, holding no admission
// slot, lock or connection of the service's. A body over the cap is
// answered 413, one the client failed to send 400. The body read stays
// readable, and ContentLength is its length, however it was framed.
func ReadBody() gin.HandlerFunc {
	return func(c *gin.Context) {
		if c.Request.Body == nil || c.Request.Body == http.NoBody {
			c.Next()
			return
		}
		ctx := c.Request.Context()
		// A cancelled request (a shutdown that outlived its timeout) must
		// not wait on a client that is still sending: a read has no
		// context, so the cancellation ends it with a deadline.
		unblock := context.AfterFunc(ctx, func() { _ = http.NewResponseController(c.Writer).SetReadDeadline(time.Now()) })
		b, err := io.ReadAll(c.Request.Body)
		unblock()
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			Write(c, decodeError(err))
			return
		case err != nil && ctx.Err() != nil:
			Write(c, context.Cause(ctx))
			return
		case err != nil:
			Write(c, BadRequest("the body could not be read: "+err.Error()))
			return
		}
		c.Request.Body = io.NopCloser(bytes.NewReader(b))
		c.Request.ContentLength = int64(len(b))
		c.Next()
	}
}

// NoBody refuses a body on a route that takes none: a client that sent
// one meant something by it (an option, an amount), and serving the
// request without it would serve one the client did not send.
func NoBody() gin.HandlerFunc {
	return func(c *gin.Context) {
		empty, err := EmptyBody(c)
		if err == nil && !empty {
			err = BadRequest(c.Request.Method + " " + c.FullPath() + " takes no body; send none")
		}
		if err != nil {
			Write(c, err)
			return
		}
		c.Next()
	}
}

// Query refuses a request whose query string does not parse (a bad
// percent-escape, a semicolon): net/url drops such a pair in silence, and
// a parameter the client sent would be served as absent. A parameter
// given twice is refused too: one of the values would be served as if the
// other had not been sent.
func Query() gin.HandlerFunc {
	return func(c *gin.Context) {
		values, err := url.ParseQuery(c.Request.URL.RawQuery)
		if err != nil {
			Write(c, BadRequest("the query string does not parse: "+err.Error()))
			return
		}
		for name, v := range values {
			if len(v) > 1 {
				Write(c, BadRequest(fmt.Sprintf("the query names %q %d times; send it once", name, len(v))))
				return
			}
		}
		c.Next()
	}
}

// EmptyBody reports whether the request has no body bytes at all,
// however it is framed: a chunked request with no chunk has no
// Content-Length (-1), not 0. What it reads stays readable.
func EmptyBody(c *gin.Context) (bool, error) {
	body := c.Request.Body
	if body == nil || body == http.NoBody || c.Request.ContentLength == 0 {
		return true, nil
	}
	var first [1]byte
	n, err := io.ReadFull(body, first[:])
	if n == 0 {
		if errors.Is(err, io.EOF) {
			return true, nil
		}
		return false, decodeError(err)
	}
	c.Request.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(first[:n]), body), body}
	return false, nil
}

// DecodeJSON reads the request body as exactly one JSON object into dst. It
// refuses, as a problem whose detail names the fault: a missing media type
// or one other than JSON (415), a body over the limit (413), malformed JSON, unknown
// fields, values of the wrong type or out of range, and data after the
// object (400). Unknown fields are refused because a misspelt optional field
// would otherwise be ignored in silence.
func DecodeJSON(c *gin.Context, dst any) error {
	// A body without Content-Type is refused too: guessing JSON would
	// accept what a stricter proxy or a later version refuses, and the docs
	// promise 415. No body at all is told it is empty (400) below.
	switch ct := c.GetHeader("Content-Type"); {
	case len(c.Request.Header.Values("Content-Type")) > 1:
		// Either could be meant, as with two Authorization headers.
		return New(http.StatusUnsupportedMediaType, "unsupported-media-type",
			"the request has two Content-Type headers; send one: application/json")
	case ct == "" && c.Request.ContentLength != 0:
		return New(http.StatusUnsupportedMediaType, "unsupported-media-type",
			"the request has a body but no Content-Type; send application/json")
	case ct != "":
		mt, params, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return New(http.StatusUnsupportedMediaType, "unsupported-media-type",
				fmt.Sprintf("Content-Type is %q; send application/json", ct))
		}
		// JSON is UTF-8 (RFC 8259 §8.1): a body declared as anything else
		// would be read as UTF-8 all the same and mean something else.
		if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
			return New(http.StatusUnsupportedMediaType, "unsupported-media-type",
				fmt.Sprintf("Content-Type has charset %q; JSON is UTF-8: send charset=utf-8 or none", cs))
		}
	}
	if ce := c.GetHeader("Content-Encoding"); ce != "" && !strings.EqualFold(ce, "identity") {
		return New(http.StatusUnsupportedMediaType, "unsupported-media-type",
			fmt.Sprintf("Content-Encoding %q is not supported; send the body uncompressed", ce))
	}
	body, err := io.ReadAll(c.Request.Body)
	if err != nil {
		return decodeError(err)
	}
	// encoding/json replaces an invalid byte with U+FFFD in silence: the
	// name stored would not be the one sent.
	if !utf8.Valid(body) {
		return BadRequest(fmt.Sprintf("the body is not valid UTF-8 (JSON is UTF-8): an invalid byte at offset %d", invalidUTF8(body)))
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		return decodeError(err)
	}
	// A second value, even whitespace-separated, means the client sent
	// something other than what it thinks it sent.
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return decodeError(err)
		}
		return BadRequest("the body has data after the JSON object; send exactly one object")
	}
	if err := refuseRepeatedMember(body); err != nil {
		return err
	}
	return refuseInexactName(body, reflect.TypeOf(dst), "")
}

// refuseInexactName refuses a member whose name matches a field of t only
// when case is ignored, as encoding/json matches them: the docs name each
// member exactly, and a retry that spells one differently must not be
// another request that does the same thing. body is one valid JSON value.
func refuseInexactName(body []byte, t reflect.Type, at string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var members map[string]json.RawMessage
	if t.Kind() != reflect.Struct || json.Unmarshal(body, &members) != nil {
		return nil // not an object for a struct: nothing to match
	}
	for name, raw := range members {
		f, exact := fieldNamed(t, name)
		switch {
		case f == nil:
			continue // unknown fields were refused by the decoder
		case !exact:
			where := ""
			if at != "" {
				where = " in " + at
			}
			return BadRequest(fmt.Sprintf("unknown field %q%s; names are case-sensitive: %q", name, where, jsonName(*f)))
		}
		if err := refuseInexactName(raw, f.Type, at+"/"+escapePointer(name)); err != nil {
			return err
		}
	}
	return nil
}

// fieldNamed finds t's field that name decodes into, and whether its JSON
// name is exactly name.
func fieldNamed(t reflect.Type, name string) (*reflect.StructField, bool) {
	var folded *reflect.StructField
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() || f.Tag.Get("json") == "-" {
			continue
		}
		switch n := jsonName(f); {
		case n == name:
			return &f, true
		case strings.EqualFold(n, name) && folded == nil:
			folded = &f
		}
	}
	return folded, false
}

// jsonName is the member name encoding/json gives f.
func jsonName(f reflect.StructField) string {
	if n, _, _ := strings.Cut(f.Tag.Get("json"), ","); n != "" {
		return n
	}
	return f.Name
}

// refuseRepeatedMember refuses an object that names a member twice, also
// when the two spellings differ only by case or escapes: encoding/json
// matches names case-insensitively and keeps the last value, while a proxy,
// a log reader or the client's own parser may keep the first, so the body
// would mean two things. body is one valid JSON value.
func refuseRepeatedMember(body []byte) error {
	type object struct {
		path    string
		seen    map[string]bool
		inObj   bool
		wantKey bool
		key     string
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var stack []*object
	valueDone := func() {
		if n := len(stack); n > 0 && stack[n-1].inObj {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err != nil {
			return nil // io.EOF: the value ended; nothing else can fail on valid JSON
		}
		var top *object
		if n := len(stack); n > 0 {
			top = stack[n-1]
		}
		if top != nil && top.inObj && top.wantKey {
			if d, ok := tok.(json.Delim); ok && d == '}' {
				stack = stack[:len(stack)-1]
				valueDone()
				continue
			}
			name := tok.(string)
			folded := foldName(name)
			if top.seen[folded] {
				where := top.path
				if where == "" {
					where = "the body"
				}
				var f Fields
				f.Add(top.path+"/"+escapePointer(name),
					fmt.Sprintf("member %q appears twice in %s; send each member once", name, where))
				return f.Err()
			}
			top.seen[folded] = true
			top.key, top.wantKey = name, false
			continue
		}
		path := ""
		if top != nil {
			path = top.path + "/" + escapePointer(top.key)
			if !top.inObj {
				path = top.path + "/" + strconv.Itoa(len(top.seen))
				top.seen[path] = true
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, &object{path: path, seen: map[string]bool{}, inObj: true, wantKey: true})
		case json.Delim('['):
			stack = append(stack, &object{path: path, seen: map[string]bool{}})
		case json.Delim(']'):
			stack = stack[:len(stack)-1]
			valueDone()
		default:
			valueDone()
		}
	}
}

// foldName maps every spelling encoding/json takes for one field name (it
// compares with Unicode case folding) to one string.
func foldName(name string) string {
	var b strings.Builder
	for _, r := range name {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}

func escapePointer(name string) string {
	return strings.NewReplacer("~", "~0", "/", "~1").Replace(name)
}

func decodeError(err error) error {
	var (
		syntax *json.SyntaxError
		typ    *json.UnmarshalTypeError
		mbe    *http.MaxBytesError
	)
	switch {
	case errors.As(err, &mbe):
		return New(http.StatusRequestEntityTooLarge, "body-too-large",
			fmt.Sprintf("the body is larger than %d bytes", mbe.Limit))
	case errors.Is(err, io.EOF):
		return BadRequest("the body is empty; send a JSON object")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return BadRequest("the body ends in the middle of a JSON value")
	case errors.As(err, &syntax):
		return BadRequest(fmt.Sprintf("the body is not valid JSON at byte %d: %s", syntax.Offset, syntax.Error()))
	case errors.As(err, &typ):
		if typ.Field == "" {
			return BadRequest(fmt.Sprintf("the body must be a JSON object, got %s", typ.Value))
		}
		var f Fields
		f.Add(pointer(typ.Field), fmt.Sprintf("%s must be %s, got %s", typ.Field, describe(typ.Type), got(typ.Value)))
		return f.Err()
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		// encoding/json has no type for this one; its message is stable.
		name := strings.TrimPrefix(err.Error(), "json: unknown field ")
		var f Fields
		f.Add(pointer(strings.Trim(name, `"`)), fmt.Sprintf("unknown field %s", name))
		return f.Err()
	}
	return BadRequest("the body could not be decoded: " + err.Error())
}

// got says what the client sent, from encoding/json's description of it.
func got(v string) string {
	if n, ok := strings.CutPrefix(v, "number "); ok {
		return n
	}
	return "a JSON " + v
}

func describe(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.Int64:
		return "an integer between -9223372036854775808 and 9223372036854775807"
	case reflect.Int, reflect.Int32:
		return "an integer between -2147483648 and 2147483647"
	case reflect.Uint64, reflect.Uint, reflect.Uint32:
		return "a non-negative integer"
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "true or false"
	case reflect.Struct, reflect.Map:
		return "an object"
	case reflect.Slice:
		return "an array"
	}
	return "a " + t.String()
}

// invalidUTF8 is the offset of b's first byte that is not valid UTF-8.
func invalidUTF8(b []byte) int {
	for i := 0; i < len(b); {
		r, size := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return len(b)
}
