package problem

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"

	"github.com/gin-gonic/gin"
)

// fuzzRequest has the shapes the handlers decode: optional integers as
// pointers (so a missing field differs from zero), strings, and a nested
// object.
type fuzzRequest struct {
	From     *int64 `json:"from"`
	Amount   *int64 `json:"amount_cents"`
	SKU      string `json:"sku"`
	Quantity *int   `json:"quantity"`
	Limit    *int64 `json:"per_user_limit"`
	Meta     *struct {
		Note string `json:"note"`
	} `json:"meta"`
}

// FuzzDecodeJSON feeds DecodeJSON arbitrary bodies and media types. It must
// never panic; it either decodes exactly one object that reads back the
// same after a round trip, or refuses with a problem of status 400, 413 or
// 415 whose status Table.From keeps.
func FuzzDecodeJSON(f *testing.F) {
	for _, seed := range []struct{ ct, body string }{
		{"application/json", `{"amount_cents":100}`},
		{"application/json", `{"from":1,"amount_cents":5,"sku":"x","quantity":2,"meta":{"note":"n"}}`},
		{"application/json; charset=utf-8", `{"amount_cents":9223372036854775807}`},
		{"application/json", `{"amount_cents":9223372036854775808}`},
		{"application/json", `{"amount_cents":1.5}`},
		{"application/json", `{"amount_cents":"1"}`},
		{"application/json", `{"unknown":1}`},
		{"application/json", `{"amount_cents":1} {"amount_cents":2}`},
		{"application/json", `[]`},
		{"application/json", ``},
		{"application/json", `{"amount_cents":`},
		{"text/plain", `{"amount_cents":1}`},
		{"", `{"amount_cents":1}`},
		{"application/problem+json", `{"quantity":-1}`},
		{"application/json", `{"sku":"\u0000\ud800"}`},
		{"application/json", `{"meta":{"note":"a","extra":1}}`},
	} {
		f.Add(seed.ct, []byte(seed.body))
	}
	gin.SetMode(gin.TestMode)
	f.Fuzz(func(t *testing.T, ct string, body []byte) {
		w := httptest.NewRecorder()
		c, _ := gin.CreateTestContext(w)
		c.Request = httptest.NewRequest("POST", "/", bytes.NewReader(body))
		if ct != "" {
			c.Request.Header.Set("Content-Type", ct)
		}
		c.Request.Body = http.MaxBytesReader(w, c.Request.Body, 1024)
		var got fuzzRequest
		err := DecodeJSON(c, &got)
		if err != nil {
			var pe *Error
			if !errors.As(err, &pe) {
				t.Fatalf("refusal is not a *problem.Error: %T %v", err, err)
			}
			switch pe.Status {
			case http.StatusBadRequest, http.StatusRequestEntityTooLarge, http.StatusUnsupportedMediaType:
			default:
				t.Fatalf("refusal with status %d: %v", pe.Status, err)
			}
			if d, _ := Table(nil).From(err); d.Status != pe.Status || d.Detail == "" {
				t.Fatalf("From(%v) = %+v", err, d)
			}
			return
		}
		if len(body) > 1024 {
			t.Fatalf("accepted a %d-byte body over the 1024-byte limit", len(body))
		}
		again, err := json.Marshal(got)
		if err != nil {
			t.Fatal(err)
		}
		var back fuzzRequest
		if err := json.Unmarshal(again, &back); err != nil || !reflect.DeepEqual(back, got) {
			t.Fatalf("decoded %+v does not survive a round trip: %s, %v", got, again, err)
		}
	})
}
