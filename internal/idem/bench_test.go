package idem

import (
	"net/http"
	"strconv"
	"testing"
)

// BenchmarkKeyedRequest is a request and its retry through the optional
// guard on the real Redis: with a key (the first runs, the retry replays)
// and without (both run). The handler is trivial, so the difference is
// what idempotency adds. BenchmarkMintedToken is the orders flow: mint a
// token, send the request, retry it.
func BenchmarkKeyedRequest(b *testing.B) {
	f := newFixture(b, Options{})
	for _, keyed := range []bool{false, true} {
		b.Run("keyed="+strconv.FormatBool(keyed), func(b *testing.B) {
			for i := 0; b.Loop(); i++ {
				key := ""
				if keyed {
					key = "bench-" + strconv.Itoa(i)
				}
				for range 2 {
					if w := f.do("POST", optional, 1, key, `{"a":1}`); w.Code != http.StatusCreated {
						b.Fatal(w.Code, w.Body)
					}
				}
			}
		})
	}
}

func BenchmarkMintedToken(b *testing.B) {
	f := newFixture(b, Options{MaxTokens: 1 << 30})
	for b.Loop() {
		key := f.token(1)
		for range 2 {
			if w := f.do("POST", required, 1, key, `{"a":1}`); w.Code != http.StatusCreated {
				b.Fatal(w.Code, w.Body)
			}
		}
	}
}
