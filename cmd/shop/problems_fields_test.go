package main

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"
)

// TestProblemListsEveryInvalidField: a body with several invalid fields
// is answered with all of them, each as a JSON Pointer and a detail in the
// problem's errors member (RFC 9457 extension), not only the first; the
// answer matches openapi.yaml (contract.run).
func TestProblemListsEveryInvalidField(t *testing.T) {
	srv, _ := newTestServer(t, nil)
	c := newContract(t, srv.URL)
	u1 := shoptestToken(t, 1)
	for _, tc := range []struct {
		name, path, token, body string
		pointers                []string
	}{
		{"transfer-all-three", "/api/v1/transfers", u1, `{"from":0,"amount_cents":-5}`, []string{"/from", "/to", "/amount_cents"}},
		{"account-both", "/admin/v1/accounts", testAdmin, `{"id":-1,"balance_cents":-2}`, []string{"/id", "/balance_cents"}},
		{"wrong-type", "/api/v1/transfers", u1, `{"from":"a","to":2,"amount_cents":1}`, []string{"/from"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := c.run(t, srv, apiCase{name: tc.name, method: http.MethodPost, path: tc.path, token: tc.token, body: tc.body, status: 400})
			var p struct {
				Detail string `json:"detail"`
				Errors []struct {
					Pointer string `json:"pointer"`
					Detail  string `json:"detail"`
				} `json:"errors"`
			}
			if err := json.Unmarshal(body, &p); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, e := range p.Errors {
				got = append(got, e.Pointer)
				if e.Detail == "" || !strings.Contains(p.Detail, e.Detail) {
					t.Errorf("errors member %+v: its detail must be non-empty and in the problem's detail %q", e, p.Detail)
				}
			}
			if !slices.Equal(got, tc.pointers) {
				t.Errorf("errors pointers %v, want %v\n%s", got, tc.pointers, body)
			}
		})
	}
}
