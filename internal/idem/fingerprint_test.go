package idem

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestCanonicalNumber(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"0", "0"}, {"-0", "0"}, {"0.000", "0"}, {"0e5", "0"},
		{"1", "1e0"}, {"1.0", "1e0"}, {"10e-1", "1e0"}, {"0.1e1", "1e0"}, {"1E+0", "1e0"},
		{"100", "1e2"}, {"1e2", "1e2"}, {"-1.50e2", "-15e1"}, {"-150", "-15e1"},
		{"0.5", "5e-1"}, {"-0.05e+1", "-5e-1"},
		{"9223372036854775807", "9223372036854775807e0"},
		{"9223372036854775808", "9223372036854775808e0"}, // beyond int64, still exact
		{"12345678901234567890.5", "123456789012345678905e-1"},
		{"1e99999999999999999999", "1e99999999999999999999"},
		{"123e-99999999999999999999", "123e-99999999999999999999"},
	} {
		if got := canonicalNumber(tc.in); got != tc.want {
			t.Errorf("canonicalNumber(%s) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestCanonicalBody(t *testing.T) {
	for _, tc := range []struct {
		name string
		a, b string
		same bool
	}{
		{"empty-and-blank", "", " \n\t", true},
		{"empty-and-null", "", "null", false},
		{"member-order", `{"a":1,"b":2}`, `{"b":2,"a":1}`, true},
		{"nested-member-order", `{"x":{"a":[1,{"c":1,"d":2}]}}`, `{"x":{"a":[1,{"d":2,"c":1}]}}`, true},
		{"whitespace", `{"a":[1,2]}`, " {\"a\" :\n[ 1 , 2 ] } ", true},
		{"escapes", `{"a":"é\n"}`, `{"\u0061":"\u00e9\u000a"}`, true},
		{"number-value", `[1, 1.0, 100]`, `[1e0, 10e-1, 1e2]`, true},
		{"array-order", `[1,2]`, `[2,1]`, false},
		{"string-vs-number", `{"a":"1"}`, `{"a":1}`, false},
		{"true-vs-string", `[true]`, `["true"]`, false},
		{"malformed-kept-raw", `{"a":`, `{"a": `, false},
		{"malformed-vs-canonical", `{"a":1}x`, `{"a":1}x`, true},
		{"two-values", `{} {}`, `{}`, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ca, cb := canonicalBody([]byte(tc.a)), canonicalBody([]byte(tc.b))
			if bytes.Equal(ca, cb) != tc.same {
				t.Fatalf("canonical %q and %q; same = %v, want %v", ca, cb, !tc.same, tc.same)
			}
		})
	}
}

// FuzzCanonicalBody: for any body that is one JSON value, the canonical
// text is itself JSON and canonical, and re-indenting the body or
// re-encoding it (members sorted, escapes rewritten) does not change it.
// A body that is not one JSON value, or names a member twice (exactly or
// by case), never shares a canonical text with one that is.
func FuzzCanonicalBody(f *testing.F) {
	for _, seed := range []string{
		`{"amount_cents":100}`, `{"from":1,"to":2,"amount_cents":5}`, `{"quantity":1.0}`,
		`[1e400, -0.0, 1E-7]`, `{"a":{"b":[null,true,false,"\u00e9"]}}`, `"x"`, `{"a":1,"a":2}`,
		``, `{"a":`, `{} {}`, "\xff", `{"\ud800":1}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		c := canonicalBody(body)
		if !isOneValue(body) || repeatsName(body) {
			if len(bytes.TrimSpace(body)) > 0 && !bytes.HasPrefix(c, []byte("raw\x00")) {
				t.Fatalf("%q is not one JSON value but has a canonical text %q", body, c)
			}
			return
		}
		if !json.Valid(c) {
			t.Fatalf("canonical text of %q is not JSON: %q", body, c)
		}
		if again := canonicalBody(c); !bytes.Equal(again, c) {
			t.Fatalf("not a fixed point: %q → %q → %q", body, c, again)
		}
		var indented bytes.Buffer
		if err := json.Indent(&indented, body, " ", "\t"); err == nil {
			if got := canonicalBody(indented.Bytes()); !bytes.Equal(got, c) {
				t.Fatalf("indenting %q changed its canonical text: %q, want %q", body, got, c)
			}
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var v any
		if err := dec.Decode(&v); err != nil {
			t.Fatal(err)
		}
		reencoded, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if got := canonicalBody(reencoded); !bytes.Equal(got, c) {
			t.Fatalf("re-encoding %q as %q changed its canonical text: %q, want %q", body, reencoded, got, c)
		}
	})
}

func isOneValue(b []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return false
	}
	_, err := dec.Token()
	return err != nil && err.Error() == "EOF"
}
