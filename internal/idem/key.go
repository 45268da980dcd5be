package idem

import (
	"fmt"
	"strings"
)

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
