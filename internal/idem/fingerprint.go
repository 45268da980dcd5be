package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"math/big"
	"slices"
	"strconv"
	"strings"
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
// cannot equal a canonical text; the handler will refuse it anyway.
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
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return append([]byte("raw\x00"), body...)
	}
	var b bytes.Buffer
	writeCanonical(&b, v)
	return b.Bytes()
}

func writeCanonical(b *bytes.Buffer, v any) {
	switch v := v.(type) {
	case map[string]any:
		names := make([]string, 0, len(v))
		for name := range v {
			names = append(names, name)
		}
		slices.Sort(names)
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
	case []any:
		b.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				b.WriteByte(',')
			}
			writeCanonical(b, e)
		}
		b.WriteByte(']')
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
