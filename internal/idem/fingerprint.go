package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"unicode"
)

// fingerprint identifies a request: method, path, query (its parameters
// sorted), user and the canonical form of the body. Headers are left out: a
// retry may legitimately carry a new Authorization token or request id.
func fingerprint(method, path, query string, user int64, body []byte) string {
	h := sha256.New()
	for _, part := range []string{method, path, query, strconv.FormatInt(user, 10)} {
		h.Write([]byte(part))
		h.Write([]byte{0})
	}
	h.Write(canonicalBody(body))
	return hex.EncodeToString(h.Sum(nil))
}

// canonicalBody is the body as one canonical JSON text: object members
// sorted by name, no insignificant whitespace, strings with one escaping,
// numbers by value (1, 1.0 and 10e-1 are one number). A body that is not
// exactly one JSON value is kept as its raw bytes, marked so that it
// cannot equal a canonical text; the handler will refuse it anyway. So is
// a body that names a member twice in one object, exactly or only by case:
// encoding/json fills a struct field from the last of the names that match
// it case-insensitively (and merges repeated objects), so member order
// decides what the handler sees, and a sorted map cannot keep it.
func canonicalBody(body []byte) []byte {
	if len(bytes.TrimSpace(body)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return append([]byte("raw\x00"), body...)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) || repeatsName(body) {
		return append([]byte("raw\x00"), body...)
	}
	var b bytes.Buffer
	writeCanonical(&b, v)
	return b.Bytes()
}

// repeatsName reports whether an object in body, which is one valid JSON
// value, has two members whose names are equal under case folding.
func repeatsName(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	var t nameTracker
	for {
		tok, err := dec.Token()
		if err != nil {
			return false // io.EOF: the body was checked valid before
		}
		if t.next(tok) {
			return true
		}
	}
}

// nameTracker follows the objects and arrays a JSON token stream opens,
// and the member names of each open object.
type nameTracker struct {
	open []*openObject // nil for an array
}

type openObject struct {
	names    map[string]bool // folded
	wantName bool
}

func (t *nameTracker) top() *openObject {
	if len(t.open) == 0 {
		return nil
	}
	return t.open[len(t.open)-1]
}

// next follows the stream's next token, and reports whether it is a name
// its object has already.
func (t *nameTracker) next(tok json.Token) (repeated bool) {
	if name, ok := tok.(string); ok && t.top() != nil && t.top().wantName {
		return t.name(name)
	}
	switch tok {
	case json.Delim('{'):
		t.open = append(t.open, &openObject{names: map[string]bool{}, wantName: true})
		return false
	case json.Delim('['):
		t.open = append(t.open, nil)
		return false
	case json.Delim('}'), json.Delim(']'):
		t.open = t.open[:len(t.open)-1]
	}
	if o := t.top(); o != nil { // a member's value ended: a name comes next
		o.wantName = true
	}
	return false
}

// name records a member name of the innermost object, and reports whether
// the object had it already.
func (t *nameTracker) name(name string) (repeated bool) {
	o, folded := t.top(), foldName(name)
	if o.names[folded] {
		return true
	}
	o.names[folded] = true
	o.wantName = false
	return false
}

// foldName maps names that strings.EqualFold (and encoding/json's field
// matching) deems equal to one string: each rune becomes the least rune of
// its simple case-folding orbit (so K, k and the Kelvin sign are one).
func foldName(s string) string {
	var b strings.Builder
	for _, r := range s {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}

func writeCanonical(b *bytes.Buffer, v any) {
	switch v := v.(type) {
	case map[string]any:
		writeObject(b, v)
	case []any:
		writeArray(b, v)
	case string:
		writeString(b, v)
	case json.Number:
		b.WriteString(canonicalNumber(string(v)))
	case bool:
		b.WriteString(strconv.FormatBool(v))
	case nil:
		b.WriteString("null")
	}
}

// writeObject writes v's members sorted by name.
func writeObject(b *bytes.Buffer, v map[string]any) {
	names := slices.Sorted(maps.Keys(v))
	b.WriteByte('{')
	for i, name := range names {
		if i > 0 {
			b.WriteByte(',')
		}
		writeString(b, name)
		b.WriteByte(':')
		writeCanonical(b, v[name])
	}
	b.WriteByte('}')
}

func writeArray(b *bytes.Buffer, v []any) {
	b.WriteByte('[')
	for i, e := range v {
		if i > 0 {
			b.WriteByte(',')
		}
		writeCanonical(b, e)
	}
	b.WriteByte(']')
}

func writeString(b *bytes.Buffer, s string) {
	enc, _ := json.Marshal(s) // a string always encodes
	b.Write(enc)
}

// canonicalNumber writes a JSON number (as encoding/json validated it) as
// digits without leading or trailing zeros and a decimal exponent:
// "-1.50e2" → "-15e1", "0.0" → "0". Exact for any size: no float64 in
// between, so two amounts in cents never collide by rounding, and the
// exponent is a big.Int so that "1e99999999999999999999" costs its length,
// not its value.
func canonicalNumber(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, exp, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	e := new(big.Int)
	if exp != "" {
		e.SetString(strings.TrimPrefix(exp, "+"), 10) // valid JSON: sign and digits only
	}
	e.Sub(e, big.NewInt(int64(len(frac))))
	trimmed := strings.TrimRight(digits, "0")
	e.Add(e, big.NewInt(int64(len(digits)-len(trimmed))))
	if trimmed == "" {
		return "0"
	}
	sign := ""
	if neg {
		sign = "-"
	}
	return sign + trimmed + "e" + e.String()
}
