package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"github.com/golang-jwt/jwt/v5"

	"github.com/lockbench/shop/internal/apidoc"
	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/problem"
	"github.com/lockbench/shop/internal/testenv"
)

const (
	testSecret = "api-test-secret-0123456789abcdef0123"
	testAdmin  = "api-test-admin-token-0123456789abcdef"
)

// newTestServer runs the whole service in this process on the embedded
// defaults (SQLite in a temp dir, in-process Redis, backend redis), with
// a broker of its own (testenv.ServiceBroker): it needs no server, so the
// API contract is checked on every machine.
func newTestServer(t *testing.T, env map[string]string) (*httptest.Server, *app) {
	t.Helper()
	vars := map[string]string{
		"SHOP_ENV": "production", "SHOP_JWT_SECRET": testSecret, "SHOP_ADMIN_TOKEN": testAdmin,
		"SHOP_MAX_BODY_BYTES": "1024", "SHOP_ALLOW_RESET": "true",
		// /metrics on the handler under test, as asked for by naming the
		// API's own address.
		"SHOP_METRICS_ADDR": config.DefaultHTTPAddr,
	}
	for k, v := range env {
		vars[k] = v
	}
	if _, ok := vars["SHOP_NATS_URL"]; !ok {
		vars["SHOP_NATS_URL"] = testenv.ServiceBroker(t)
	}
	cfg, err := config.Load(func(k string) string { return vars[k] })
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	a, err := newApp(context.Background(), cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.handler)
	t.Cleanup(func() {
		srv.Close()
		if err := a.close(); err != nil {
			t.Error(err)
		}
	})
	return srv, a
}

// contract checks responses against openapi.yaml and remembers which
// operations answered which status classes.
type contract struct {
	router routers.Router
	seen   map[string]map[int]bool // "GET /api/v1/..." → status class (2, 4, 5) → seen
}

func newContract(t *testing.T, serverURL string) *contract {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(apidoc.Spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is invalid: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: serverURL}}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &contract{router: router, seen: map[string]map[int]bool{}}
}

// check validates one exchange. A request that matches no operation (404,
// 405) must still answer a problem that fits the Problem schema.
func (c *contract) check(t *testing.T, req *http.Request, res *http.Response, body []byte) {
	t.Helper()
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		if res.StatusCode != http.StatusNotFound && res.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s %s answered %d but is not in openapi.yaml", req.Method, req.URL.Path, res.StatusCode)
		}
		return
	}
	op := req.Method + " " + route.Path
	if c.seen[op] == nil {
		c.seen[op] = map[int]bool{}
	}
	c.seen[op][res.StatusCode/100] = true
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route},
		Status:                 res.StatusCode,
		Header:                 res.Header,
		Body:                   io.NopCloser(bytes.NewReader(body)),
		Options:                &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		t.Errorf("%s %s → %d does not match openapi.yaml: %v\n%s", req.Method, req.URL.Path, res.StatusCode, err, body)
	}
}

type apiCase struct {
	name   string
	method string
	path   string
	token  string // sent as "Bearer <token>" when not empty
	header map[string]string
	body   string
	status int
	// detail must occur in the problem's detail (errors only).
	detail string
}

func (c *contract) run(t *testing.T, srv *httptest.Server, tc apiCase) []byte {
	t.Helper()
	req := tc.request(t, srv.URL)
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != tc.status {
		t.Errorf("status %d, want %d: %s", res.StatusCode, tc.status, body)
	}
	if res.StatusCode >= 400 {
		checkProblem(t, res, body, req.URL.Path, tc.detail)
	}
	// The validator reads the request body for nothing we check; give it
	// an empty one.
	req.Body = io.NopCloser(strings.NewReader(tc.body))
	c.check(t, req, res, body)
	return body
}

// request is tc's request to the server at base.
func (tc apiCase) request(t *testing.T, base string) *http.Request {
	t.Helper()
	var rd io.Reader
	if tc.body != "" {
		rd = strings.NewReader(tc.body)
	}
	req, err := http.NewRequest(tc.method, base+tc.path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if tc.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if tc.token != "" {
		req.Header.Set("Authorization", "Bearer "+tc.token)
	}
	for k, v := range tc.header {
		req.Header.Set(k, v)
	}
	return req
}

// checkProblem: an error answer is a problem document with every field
// set, about the request's path, whose detail says detail.
func checkProblem(t *testing.T, res *http.Response, body []byte, path, detail string) {
	t.Helper()
	if ct := res.Header.Get("Content-Type"); ct != problem.ContentType {
		t.Errorf("Content-Type %q, want %s", ct, problem.ContentType)
	}
	var p problem.Details
	if err := json.Unmarshal(body, &p); err != nil {
		t.Errorf("not a problem: %v: %s", err, body)
	}
	if p.Status != res.StatusCode || p.Title == "" || !strings.HasPrefix(p.Type, problem.TypeBase) ||
		p.Instance != path || p.RequestID == "" {
		t.Errorf("problem fields wrong: %+v", p)
	}
	if !strings.Contains(p.Detail, detail) {
		t.Errorf("detail %q does not say %q", p.Detail, detail)
	}
}

func tokens(t *testing.T) map[string]string {
	t.Helper()
	now := time.Now()
	sign := func(m jwt.SigningMethod, key any, claims jwt.Claims) string {
		s, err := jwt.NewWithClaims(m, claims).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	valid := func(sub string) jwt.RegisteredClaims {
		return jwt.RegisteredClaims{Subject: sub, ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour))}
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	return map[string]string{
		"user1":   sign(jwt.SigningMethodHS256, []byte(testSecret), valid("1")),
		"user99":  sign(jwt.SigningMethodHS256, []byte(testSecret), valid("99")),
		"expired": sign(jwt.SigningMethodHS256, []byte(testSecret), jwt.RegisteredClaims{Subject: "1", ExpiresAt: jwt.NewNumericDate(now.Add(-time.Hour))}),
		"no-exp":  sign(jwt.SigningMethodHS256, []byte(testSecret), jwt.RegisteredClaims{Subject: "1"}),
		"bad-sub": sign(jwt.SigningMethodHS256, []byte(testSecret), valid("alice")),
		"forged":  sign(jwt.SigningMethodHS256, []byte("another-secret-0123456789abcdef0123"), valid("1")),
		"hs512":   sign(jwt.SigningMethodHS512, []byte(testSecret), valid("1")),
		"none":    sign(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, valid("1")),
		"rs256":   sign(jwt.SigningMethodRS256, rsaKey, valid("1")),
	}
}

// TestAPI runs every route with good and bad input against the whole
// service, checks each answer against openapi.yaml, and checks that the bad
// requests changed nothing.
func TestAPI(t *testing.T) {
	srv, _ := newTestServer(t, nil)
	c := newContract(t, srv.URL)
	tok := tokens(t)
	u1 := tok["user1"]

	good := []apiCase{
		{name: "reset-200-default", method: "POST", path: "/admin/v1/reset", token: testAdmin, status: 200},
		{name: "reset-200-named", method: "POST", path: "/admin/v1/reset", token: testAdmin, body: `{"fixture":"default"}`, status: 200},
		{name: "products-201-create", method: "POST", path: "/admin/v1/products", token: testAdmin, status: 201,
			body: `{"sku":"api-1","name":"API item","stock":5,"price_cents":250}`},
		{name: "products-200-replace", method: "POST", path: "/admin/v1/products", token: testAdmin, status: 200,
			body: `{"sku":"api-1","name":"API item","stock":4,"price_cents":250,"per_user_limit":2}`},
		{name: "accounts-201-create", method: "POST", path: "/admin/v1/accounts", token: testAdmin, status: 201, body: `{"id":42,"balance_cents":0}`},
		{name: "accounts-200-replace", method: "POST", path: "/admin/v1/accounts", token: testAdmin, status: 200, body: `{"id":42,"balance_cents":700}`},
		{name: "account-200", method: "GET", path: "/api/v1/accounts/1", token: u1, status: 200},
		{name: "deposit-200", method: "POST", path: "/api/v1/accounts/1/deposit", token: u1, body: `{"amount_cents":500}`, status: 200},
		{name: "withdraw-200", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents":300}`, status: 200},
		{name: "transfer-200", method: "POST", path: "/api/v1/transfers", token: u1, body: `{"from":1,"to":42,"amount_cents":100}`, status: 200},
		{name: "product-200", method: "GET", path: "/api/v1/products/api-1", token: u1, status: 200},
		{name: "purchase-201", method: "POST", path: "/api/v1/seckill/api-1/purchase", token: u1, body: `{"quantity":2}`, status: 201},
		{name: "audit-200", method: "GET", path: "/admin/v1/audit", token: testAdmin, status: 200},
		{name: "points-200", method: "GET", path: "/api/v1/users/1/points", token: u1, status: 200},
		{name: "healthz-200", method: "GET", path: "/healthz", status: 200},
		{name: "readyz-200", method: "GET", path: "/readyz", status: 200},
		{name: "metrics-200", method: "GET", path: "/metrics", status: 200},
		{name: "openapi-200", method: "GET", path: "/openapi.yaml", status: 200},
	}
	u2 := shoptestToken(t, 2)
	good = append(good,
		apiCase{name: "entities-201", method: "POST", path: "/admin/v1/entities", token: testAdmin, body: `{"type":"post","id":"api-7","owner_id":2}`, status: 201},
		apiCase{name: "entities-200-again", method: "POST", path: "/admin/v1/entities", token: testAdmin, body: `{"type":"post","id":"api-7","owner_id":2}`, status: 200},
		apiCase{name: "like-200", method: "PUT", path: "/api/v1/likes/post/api-7", token: u1, status: 200},
		apiCase{name: "likes-200", method: "GET", path: "/api/v1/likes/post/api-7", token: u1, status: 200},
		apiCase{name: "unlike-200", method: "DELETE", path: "/api/v1/likes/post/api-7", token: u1, status: 200},
		apiCase{name: "received-200", method: "GET", path: "/api/v1/users/2/likes", token: u1, status: 200},
	)
	for _, tc := range good {
		t.Run(tc.name, func(t *testing.T) { c.run(t, srv, tc) })
	}
	var idemToken struct{ Token string }
	_ = json.Unmarshal(c.run(t, srv, apiCase{name: "tokens-201", method: "POST", path: "/api/v1/idempotency-tokens", token: u2, status: 201}), &idemToken)
	order := apiCase{name: "orders-201", method: "POST", path: "/api/v1/orders", token: u2, body: `{"sku":"api-1","quantity":1}`,
		header: map[string]string{"Idempotency-Key": idemToken.Token}, status: 201}
	var placed struct{ ID int64 }
	_ = json.Unmarshal(c.run(t, srv, order), &placed)
	order.name = "orders-201-replayed"
	c.run(t, srv, order)
	orderPath := fmt.Sprintf("/api/v1/orders/%d", placed.ID)
	c.run(t, srv, apiCase{name: "order-200", method: "GET", path: orderPath, token: u2, status: 200})
	c.run(t, srv, apiCase{name: "order-pay-200", method: "POST", path: orderPath + "/pay", token: u2, status: 200})
	c.run(t, srv, apiCase{name: "order-pay-200-again", method: "POST", path: orderPath + "/pay", token: u2, status: 200})
	c.run(t, srv, apiCase{name: "orders-list-200", method: "GET", path: "/api/v1/orders?limit=1", token: u2, status: 200})
	_ = json.Unmarshal(c.run(t, srv, apiCase{name: "tokens-201-paying", method: "POST", path: "/api/v1/idempotency-tokens", token: u2, status: 201}), &idemToken)
	c.run(t, srv, apiCase{name: "product-201-free", method: "POST", path: "/admin/v1/products", token: testAdmin,
		body: `{"sku":"api-free","name":"Free sample","stock":3,"price_cents":0}`, status: 201})
	c.run(t, srv, apiCase{name: "orders-201-free-paid", method: "POST", path: "/api/v1/orders", token: u2, body: `{"sku":"api-free","quantity":1,"pay":true}`,
		header: map[string]string{"Idempotency-Key": idemToken.Token}, status: 201})

	before := snapshot(t, c, srv)
	oversize := `{"amount_cents":1,"pad":"` + strings.Repeat("x", 2000) + `"}`
	bad := []apiCase{
		// amounts and bodies
		{name: "tokens-400-body", method: "POST", path: "/api/v1/idempotency-tokens", token: u2, body: `{"ttl":"forever"}`, status: 400,
			detail: "POST /api/v1/idempotency-tokens takes no body"},
		{name: "order-pay-400-body", method: "POST", path: orderPath + "/pay", token: u2, body: `{"amount_cents":1}`, status: 400,
			detail: "POST /api/v1/orders/:id/pay takes no body"},
		{name: "like-400-body", method: "PUT", path: "/api/v1/likes/post/api-7", token: u1, body: `{"liked":false}`, status: 400, detail: "takes no body"},
		{name: "unlike-400-body", method: "DELETE", path: "/api/v1/likes/post/api-7", token: u1, body: `garbage`, status: 400, detail: "takes no body"},
		{name: "withdraw-400-negative", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents":-3}`, status: 400, detail: "amount_cents must be a positive integer, got -3"},
		{name: "withdraw-400-zero", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents":0}`, status: 400, detail: "got 0"},
		{name: "withdraw-400-missing", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{}`, status: 400, detail: "amount_cents is required"},
		{name: "withdraw-400-string", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents":"10"}`, status: 400, detail: "amount_cents must be an integer"},
		{name: "withdraw-400-fraction", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents":1.5}`, status: 400, detail: "got 1.5"},
		{name: "withdraw-400-int64-overflow", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents":9223372036854775808}`, status: 400, detail: "got 9223372036854775808"},
		{name: "withdraw-400-malformed", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents":`, status: 400, detail: "ends in the middle"},
		{name: "withdraw-400-syntax", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents" 5}`, status: 400, detail: "not valid JSON at byte"},
		{name: "deposit-412-stale-if-match", method: "POST", path: "/api/v1/accounts/1/deposit", token: u1, body: `{"amount_cents":5}`,
			header: map[string]string{"If-Match": `"0"`}, status: 412, detail: `If-Match asks for "0"`},
		{name: "withdraw-400-if-match-unquoted", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents":5}`,
			header: map[string]string{"If-Match": "0"}, status: 400, detail: "an entity-tag is quoted"},
		{name: "withdraw-400-unknown-field", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents":5,"amount":5}`, status: 400, detail: `unknown field "amount"`},
		{name: "withdraw-400-trailing", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents":5} {"amount_cents":5}`, status: 400, detail: "data after the JSON object"},
		{name: "withdraw-400-empty-body", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, status: 400, detail: "body is empty"},
		{name: "products-400-invalid-utf8", method: "POST", path: "/admin/v1/products", token: testAdmin,
			body: "{\"sku\":\"api-utf8\",\"name\":\"a\xffb\",\"stock\":1,\"price_cents\":1}", status: 400,
			detail: "not valid UTF-8 (JSON is UTF-8): an invalid byte at offset 27"},
		{name: "withdraw-400-array", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `[5]`, status: 400, detail: "must be a JSON object"},
		{name: "withdraw-413-oversize", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: oversize, status: 413, detail: "larger than 1024 bytes"},
		{name: "withdraw-415-text", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents":5}`, header: map[string]string{"Content-Type": "text/plain"}, status: 415, detail: "send application/json"},
		{name: "withdraw-422-insufficient", method: "POST", path: "/api/v1/accounts/1/withdraw", token: u1, body: `{"amount_cents":100000000}`, status: 422, detail: "insufficient funds"},
		{name: "withdraw-403-other-account", method: "POST", path: "/api/v1/accounts/2/withdraw", token: u1, body: `{"amount_cents":5}`, status: 403, detail: "may act only on account 1"},
		{name: "withdraw-400-bad-id", method: "POST", path: "/api/v1/accounts/abc/withdraw", token: u1, body: `{"amount_cents":5}`, status: 400, detail: `got "abc"`},
		{name: "withdraw-404-no-account", method: "POST", path: "/api/v1/accounts/99/withdraw", token: tok["user99"], body: `{"amount_cents":5}`, status: 404, detail: "no account 99"},
		{name: "deposit-422-overflow", method: "POST", path: "/api/v1/accounts/1/deposit", token: u1, body: `{"amount_cents":9223372036854775807}`, status: 422, detail: "exceeds"},
		{name: "deposit-400-negative", method: "POST", path: "/api/v1/accounts/1/deposit", token: u1, body: `{"amount_cents":-1}`, status: 400, detail: "got -1"},
		{name: "deposit-403-other-account", method: "POST", path: "/api/v1/accounts/2/deposit", token: u1, body: `{"amount_cents":5}`, status: 403},
		{name: "account-403-other", method: "GET", path: "/api/v1/accounts/2", token: u1, status: 403},
		{name: "account-404-unknown", method: "GET", path: "/api/v1/accounts/99", token: tok["user99"], status: 404},
		{name: "account-400-zero-id", method: "GET", path: "/api/v1/accounts/0", token: u1, status: 400, detail: "positive integer"},
		{name: "transfer-400-same", method: "POST", path: "/api/v1/transfers", token: u1, body: `{"from":1,"to":1,"amount_cents":5}`, status: 400, detail: "both 1"},
		{name: "transfer-404-unknown-to", method: "POST", path: "/api/v1/transfers", token: u1, body: `{"from":1,"to":777,"amount_cents":5}`, status: 404, detail: "no account 777"},
		{name: "transfer-403-from-other", method: "POST", path: "/api/v1/transfers", token: u1, body: `{"from":2,"to":1,"amount_cents":5}`, status: 403},
		{name: "transfer-422-insufficient", method: "POST", path: "/api/v1/transfers", token: u1, body: `{"from":1,"to":2,"amount_cents":100000000}`, status: 422},
		{name: "transfer-422-recipient-overflow", method: "POST", path: "/api/v1/transfers", token: u1, body: `{"from":1,"to":2,"amount_cents":1}`, status: 200},
		{name: "transfer-400-missing-to", method: "POST", path: "/api/v1/transfers", token: u1, body: `{"from":1,"amount_cents":5}`, status: 400, detail: "to is required"},
		// seckill
		{name: "purchase-404-unknown-sku", method: "POST", path: "/api/v1/seckill/nope/purchase", token: u1, body: `{"quantity":1}`, status: 404, detail: `no product "nope"`},
		{name: "purchase-404-malformed-sku", method: "POST", path: "/api/v1/seckill/a%20b/purchase", token: u1, body: `{"quantity":1}`, status: 404},
		{name: "purchase-400-zero", method: "POST", path: "/api/v1/seckill/api-1/purchase", token: u1, body: `{"quantity":0}`, status: 400, detail: "quantity must be a positive integer, got 0"},
		{name: "purchase-400-negative", method: "POST", path: "/api/v1/seckill/api-1/purchase", token: u1, body: `{"quantity":-3}`, status: 400, detail: "quantity must be a positive integer, got -3"},
		{name: "purchase-400-string", method: "POST", path: "/api/v1/seckill/api-1/purchase", token: u1, body: `{"quantity":"1"}`, status: 400, detail: "quantity must be an integer"},
		{name: "purchase-400-missing", method: "POST", path: "/api/v1/seckill/api-1/purchase", token: u1, body: `{}`, status: 400, detail: "quantity is required"},
		{name: "purchase-409-sold-out", method: "POST", path: "/api/v1/seckill/api-1/purchase", token: tok["user99"], body: `{"quantity":2}`, status: 409, detail: "1 left, 2 asked"},
		{name: "purchase-409-limit", method: "POST", path: "/api/v1/seckill/api-1/purchase", token: u1, body: `{"quantity":1}`, status: 409, detail: "at most 2 per user"},
		{name: "product-404-unknown", method: "GET", path: "/api/v1/products/nope", token: u1, status: 404},
		// user tokens
		{name: "token-401-missing", method: "GET", path: "/api/v1/accounts/1", status: 401, detail: "send Authorization: Bearer"},
		{name: "token-401-basic-scheme", method: "GET", path: "/api/v1/accounts/1", header: map[string]string{"Authorization": "Basic dXNlcjpwYXNz"}, status: 401},
		{name: "token-401-malformed", method: "GET", path: "/api/v1/accounts/1", token: "not.a.jwt", status: 401, detail: "malformed"},
		{name: "token-401-expired", method: "GET", path: "/api/v1/accounts/1", token: tok["expired"], status: 401, detail: "expired"},
		{name: "token-401-no-exp", method: "GET", path: "/api/v1/accounts/1", token: tok["no-exp"], status: 401, detail: "no exp"},
		{name: "token-401-forged", method: "GET", path: "/api/v1/accounts/1", token: tok["forged"], status: 401, detail: "signature is invalid"},
		{name: "token-401-alg-none", method: "GET", path: "/api/v1/accounts/1", token: tok["none"], status: 401, detail: "only HS256"},
		{name: "token-401-rs256", method: "GET", path: "/api/v1/accounts/1", token: tok["rs256"], status: 401, detail: "only HS256"},
		{name: "token-401-hs512", method: "GET", path: "/api/v1/accounts/1", token: tok["hs512"], status: 401, detail: "only HS256"},
		{name: "token-401-bad-sub", method: "POST", path: "/api/v1/accounts/1/deposit", token: tok["bad-sub"], body: `{"amount_cents":5}`, status: 401, detail: "sub must be a positive integer"},
		{name: "token-401-admin-token-as-user", method: "POST", path: "/api/v1/seckill/api-1/purchase", token: testAdmin, body: `{"quantity":1}`, status: 401},
		// admin
		{name: "admin-401-missing", method: "GET", path: "/admin/v1/audit", status: 401, detail: "SHOP_ADMIN_TOKEN"},
		{name: "admin-401-wrong", method: "POST", path: "/admin/v1/reset", token: "wrong", status: 401, detail: "admin token is wrong"},
		{name: "admin-401-user-token", method: "POST", path: "/admin/v1/accounts", token: u1, body: `{"id":1,"balance_cents":0}`, status: 401},
		{name: "products-400-missing-sku", method: "POST", path: "/admin/v1/products", token: testAdmin, body: `{"name":"x","stock":1,"price_cents":1}`, status: 400, detail: "sku is required"},
		{name: "products-400-bad-sku", method: "POST", path: "/admin/v1/products", token: testAdmin, body: `{"sku":"a b","name":"x","stock":1,"price_cents":1}`, status: 400, detail: "sku must be"},
		{name: "products-400-negative-stock", method: "POST", path: "/admin/v1/products", token: testAdmin, body: `{"sku":"api-1","name":"x","stock":-1,"price_cents":1}`, status: 400, detail: "stock must be a non-negative integer, got -1"},
		{name: "products-400-unknown-field", method: "POST", path: "/admin/v1/products", token: testAdmin, body: `{"sku":"api-1","name":"x","stock":1,"price":1}`, status: 400, detail: `unknown field "price"`},
		{name: "accounts-400-negative", method: "POST", path: "/admin/v1/accounts", token: testAdmin, body: `{"id":1,"balance_cents":-5}`, status: 400, detail: "got -5"},
		{name: "accounts-400-zero-id", method: "POST", path: "/admin/v1/accounts", token: testAdmin, body: `{"id":0,"balance_cents":5}`, status: 400, detail: "id must be a positive integer, got 0"},
		{name: "reset-400-unknown-fixture", method: "POST", path: "/admin/v1/reset", token: testAdmin, body: `{"fixture":"prod"}`, status: 400, detail: `got "prod"`},
		// likes
		{name: "like-404-unknown-entity", method: "PUT", path: "/api/v1/likes/post/nope", token: u1, status: 404},
		{name: "likes-400-bad-type", method: "GET", path: "/api/v1/likes/Post/api-7", token: u1, status: 400, detail: "type must be"},
		{name: "unlike-400-bad-id", method: "DELETE", path: "/api/v1/likes/post/a%20b", token: u1, status: 400, detail: "id must be"},
		{name: "received-400-bad-id", method: "GET", path: "/api/v1/users/x/likes", token: u1, status: 400, detail: `got "x"`},
		{name: "entities-400-missing", method: "POST", path: "/admin/v1/entities", token: testAdmin, body: `{"type":"post"}`, status: 400, detail: "required"},
		{name: "entities-409-other-owner", method: "POST", path: "/admin/v1/entities", token: testAdmin, body: `{"type":"post","id":"api-7","owner_id":3}`, status: 409},
		// orders
		{name: "tokens-401-missing", method: "POST", path: "/api/v1/idempotency-tokens", status: 401},
		{name: "orders-400-no-key", method: "POST", path: "/api/v1/orders", token: u2, body: `{"sku":"api-1","quantity":1}`, status: 400, detail: "Idempotency-Key"},
		{name: "orders-422-unknown-key", method: "POST", path: "/api/v1/orders", token: u2, body: `{"sku":"api-1","quantity":1}`, header: map[string]string{"Idempotency-Key": "made-up"}, status: 422},
		{name: "orders-422-reused-key", method: "POST", path: "/api/v1/orders", token: u2, body: `{"sku":"api-1","quantity":2}`, header: map[string]string{"Idempotency-Key": idemToken.Token}, status: 422},
		{name: "order-404-other-user", method: "GET", path: orderPath, token: u1, status: 404},
		{name: "order-400-bad-id", method: "GET", path: "/api/v1/orders/x", token: u2, status: 400},
		{name: "order-pay-404-other-user", method: "POST", path: orderPath + "/pay", token: u1, status: 404},
		{name: "order-pay-400-bad-id", method: "POST", path: "/api/v1/orders/0/pay", token: u2, status: 400, detail: "positive integer"},
		{name: "orders-list-400-cursor", method: "GET", path: "/api/v1/orders?cursor=nope", token: u2, status: 400, detail: "next_cursor"},
		{name: "orders-list-400-limit-twice", method: "GET", path: "/api/v1/orders?limit=1&limit=2", token: u2, status: 400,
			detail: `the query names "limit" 2 times; send it once`},
		{name: "orders-list-400-limit", method: "GET", path: "/api/v1/orders?limit=1000", token: u2, status: 400, detail: "limit must be"},
		// loyalty
		{name: "points-403-other-user", method: "GET", path: "/api/v1/users/2/points", token: u1, status: 403, detail: "may act only on account 1"},
		{name: "points-400-bad-id", method: "GET", path: "/api/v1/users/x/points", token: u1, status: 400, detail: `got "x"`},
		// routing
		{name: "route-404", method: "GET", path: "/api/v2/accounts/1", token: u1, status: 404, detail: "no route"},
		{name: "method-405", method: "DELETE", path: "/api/v1/accounts/1", token: u1, status: 405, detail: "allowed: GET"},
	}
	// The transfer to account 2 of 1 cent is not an error: it makes sure
	// the 422 above did not leave the accounts locked. Keep the snapshot
	// honest about it.
	before["2"]++
	before["1"]--
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) { c.run(t, srv, tc) })
	}
	after := snapshot(t, c, srv)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s changed from %d to %d after the bad requests", k, v, after[k])
		}
	}

	// Every operation answered at least once with success, and every
	// /api and /admin operation at least once with a client error.
	doc, _ := openapi3.NewLoader().LoadFromData(apidoc.Spec)
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			op := method + " " + path
			if !c.seen[op][2] {
				t.Errorf("%s: no successful case", op)
			}
			if (strings.HasPrefix(path, "/api/") || strings.HasPrefix(path, "/admin/")) && !c.seen[op][4] {
				t.Errorf("%s: no client-error case", op)
			}
		}
	}
}

// TestRoutesAreDocumented: every route gin serves is in openapi.yaml.
func TestRoutesAreDocumented(t *testing.T) {
	_, a := newTestServer(t, nil)
	doc, err := openapi3.NewLoader().LoadFromData(apidoc.Spec)
	if err != nil {
		t.Fatal(err)
	}
	param := regexp.MustCompile(`:(\w+)`)
	for _, r := range a.handler.(router).Routes() {
		path := param.ReplaceAllString(r.Path, "{$1}")
		item := doc.Paths.Value(path)
		if item == nil || item.GetOperation(r.Method) == nil {
			t.Errorf("%s %s is served but not in openapi.yaml", r.Method, path)
		}
	}
}

// snapshot is what bad requests must not change: balances, stock, audit.
func snapshot(t *testing.T, c *contract, srv *httptest.Server) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	var acct struct {
		Balance int64 `json:"balance_cents"`
	}
	for _, id := range []int64{1, 2} {
		tk := shoptestToken(t, id)
		body := c.run(t, srv, apiCase{method: "GET", path: fmt.Sprintf("/api/v1/accounts/%d", id), token: tk, status: 200})
		_ = json.Unmarshal(body, &acct)
		out[fmt.Sprint(id)] = acct.Balance
	}
	var prod struct{ Stock int64 }
	_ = json.Unmarshal(c.run(t, srv, apiCase{method: "GET", path: "/api/v1/products/api-1", token: shoptestToken(t, 1), status: 200}), &prod)
	out["stock api-1"] = prod.Stock
	var audit struct {
		OK bool `json:"ok"`
	}
	_ = json.Unmarshal(c.run(t, srv, apiCase{method: "GET", path: "/admin/v1/audit", token: testAdmin, status: 200}), &audit)
	if !audit.OK {
		t.Errorf("audit not ok")
	}
	return out
}

func shoptestToken(t *testing.T, user int64) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{
		Subject: fmt.Sprint(user), ExpiresAt: jwt.NewNumericDate(time.Now().Add(time.Hour)),
	}).SignedString([]byte(testSecret))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLockServerDown: with Redis unreachable, a locked write answers 503
// problem+json (nothing changed, retry later) and /readyz names redis.
func TestLockServerDown(t *testing.T) {
	srv, _ := newTestServer(t, map[string]string{
		"SHOP_REDIS_ADDRS": "127.0.0.1:1", "SHOP_LOCK_WAIT_TIMEOUT": "2s", "SHOP_STOCK_STRATEGY": "atomic-sql",
	})
	c := newContract(t, srv.URL)
	c.run(t, srv, apiCase{name: "reset-503", method: "POST", path: "/admin/v1/reset", token: testAdmin, status: 503, detail: "unreachable"})
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/accounts", token: testAdmin, body: `{"id":5000,"balance_cents":100}`, status: 201})
	c.run(t, srv, apiCase{name: "withdraw-503", method: "POST", path: "/api/v1/accounts/5000/withdraw", token: shoptestToken(t, 5000),
		body: `{"amount_cents":5}`, status: 503, detail: "unreachable"})
	c.run(t, srv, apiCase{name: "readyz-503", method: "GET", path: "/readyz", status: 503, detail: "redis"})
	var a struct {
		Balance int64 `json:"balance_cents"`
	}
	_ = json.Unmarshal(c.run(t, srv, apiCase{name: "account-unchanged", method: "GET", path: "/api/v1/accounts/5000", token: shoptestToken(t, 5000), status: 200}), &a)
	if a.Balance != 100 {
		t.Errorf("balance %d after a refused withdrawal, want 100", a.Balance)
	}
}

// TestResetRefusedInProduction: production refuses the reset unless
// SHOP_ALLOW_RESET says otherwise, and the refused reset changes nothing.
func TestResetRefusedInProduction(t *testing.T) {
	srv, _ := newTestServer(t, map[string]string{"SHOP_ALLOW_RESET": ""})
	c := newContract(t, srv.URL)
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/accounts", token: testAdmin, body: `{"id":7,"balance_cents":700}`, status: 201})
	c.run(t, srv, apiCase{name: "reset-403", method: "POST", path: "/admin/v1/reset", token: testAdmin, status: 403, detail: "SHOP_ALLOW_RESET"})
	var a struct {
		Balance int64 `json:"balance_cents"`
	}
	_ = json.Unmarshal(c.run(t, srv, apiCase{method: "GET", path: "/api/v1/accounts/7", token: shoptestToken(t, 7), status: 200}), &a)
	if a.Balance != 700 {
		t.Errorf("balance %d after a refused reset, want 700", a.Balance)
	}
}

// TestProductNameCountsCharacters: openapi.yaml's maxLength 200 counts
// characters, as MariaDB's VARCHAR(200) does; a name of 200 non-ASCII
// characters is 400 bytes and must be accepted, 201 characters refused.
func TestProductNameCountsCharacters(t *testing.T) {
	srv, _ := newTestServer(t, nil)
	c := newContract(t, srv.URL)
	product := func(name string) string {
		return fmt.Sprintf(`{"sku":"name-%d","name":%q,"stock":1,"price_cents":1}`, len([]rune(name)), name)
	}
	c.run(t, srv, apiCase{name: "name-200-chars", method: "POST", path: "/admin/v1/products", token: testAdmin,
		body: product(strings.Repeat("é", 200)), status: 201})
	c.run(t, srv, apiCase{name: "name-201-chars", method: "POST", path: "/admin/v1/products", token: testAdmin,
		body: product(strings.Repeat("é", 201)), status: 400, detail: "at most 200 characters, got 201"})
}

// TestTransferDoesNotTellWhichAccountsExist: a transfer the sender cannot
// afford gets the same answer whether the recipient exists or not, so that
// nobody learns which account ids exist by asking for more than they have.
func TestTransferDoesNotTellWhichAccountsExist(t *testing.T) {
	srv, _ := newTestServer(t, nil)
	c := newContract(t, srv.URL)
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/reset", token: testAdmin, status: 200})
	u1 := shoptestToken(t, 1)
	var answers []problem.Details
	for _, to := range []int64{2, 987654} {
		body := c.run(t, srv, apiCase{name: fmt.Sprintf("to-%d", to), method: "POST", path: "/api/v1/transfers", token: u1,
			body: fmt.Sprintf(`{"from":1,"to":%d,"amount_cents":9000000000}`, to), status: 422})
		var p problem.Details
		_ = json.Unmarshal(body, &p)
		p.Instance, p.RequestID = "", ""
		answers = append(answers, p)
	}
	if !reflect.DeepEqual(answers[0], answers[1]) {
		t.Errorf("an existing and a missing recipient answer differently:\n%+v\n%+v", answers[0], answers[1])
	}
}

// TestHeadAnswersEveryGetRoute: HEAD is GET without the body (RFC 9110
// §9.3.2), which a load balancer's probe may send; with two Authorization
// headers the request is refused, since either one could be meant.
func TestHeadAnswersEveryGetRoute(t *testing.T) {
	srv, _ := newTestServer(t, nil)
	c := newContract(t, srv.URL)
	c.run(t, srv, apiCase{method: "POST", path: "/admin/v1/reset", token: testAdmin, status: 200})
	u1 := shoptestToken(t, 1)
	for _, path := range []string{"/healthz", "/readyz", "/api/v1/accounts/1", "/api/v1/orders"} {
		req, _ := http.NewRequest("HEAD", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+u1)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK || len(b) != 0 {
			t.Errorf("HEAD %s: %d with %d body bytes, want 200 and none", path, res.StatusCode, len(b))
		}
	}
	req, _ := http.NewRequest("GET", srv.URL+"/api/v1/accounts/1", nil)
	req.Header.Add("Authorization", "Bearer "+u1)
	req.Header.Add("Authorization", "Bearer "+shoptestToken(t, 2))
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("two Authorization headers: %d, want 401", res.StatusCode)
	}
}
