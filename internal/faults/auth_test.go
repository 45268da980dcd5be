package faults

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// TestHostileTokens sends, through the HTTP API of a real shop process,
// every token an attacker would try and every route a user may not reach:
// all are refused, and afterwards no balance has moved and the audit is
// clean.
func TestHostileTokens(t *testing.T) {
	t.Parallel()
	r := newRig(t, map[string]string{"SHOP_LOCK_BACKEND": "local"})
	shop := r.start()
	r.account(shop.URL, 1, opening)
	r.account(shop.URL, 2, opening)

	now := time.Now()
	claims := func(sub string, exp time.Time) jwt.RegisteredClaims {
		return jwt.RegisteredClaims{Subject: sub, IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(exp)}
	}
	sign := func(m jwt.SigningMethod, c jwt.Claims, key any) string {
		s, err := jwt.NewWithClaims(m, c).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	pub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	valid := claims("1", now.Add(time.Hour))
	good := r.token(1)
	parts := strings.Split(good, ".")

	deposit := func(id string) string { return "/api/v1/accounts/" + id + "/deposit" }
	cases := []struct {
		name, method, path, token string
		body                      any
		want                      int
	}{
		{"no-token-401", "POST", deposit("1"), "", map[string]int{"amount_cents": 1}, 401},
		{"alg-none-401", "POST", deposit("1"), sign(jwt.SigningMethodNone, valid, jwt.UnsafeAllowNoneSignatureType), map[string]int{"amount_cents": 1}, 401},
		{"alg-none-with-good-header-swapped-401", "POST", deposit("1"), "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0." + parts[1] + ".", map[string]int{"amount_cents": 1}, 401},
		{"rs256-signed-401", "POST", deposit("1"), sign(jwt.SigningMethodRS256, valid, key), map[string]int{"amount_cents": 1}, 401},
		{"hs256-keyed-with-rsa-public-key-401", "POST", deposit("1"), sign(jwt.SigningMethodHS256, valid, pub), map[string]int{"amount_cents": 1}, 401},
		{"hs512-with-the-secret-401", "POST", deposit("1"), sign(jwt.SigningMethodHS512, valid, []byte(r.secret)), map[string]int{"amount_cents": 1}, 401},
		{"expired-401", "POST", deposit("1"), sign(jwt.SigningMethodHS256, claims("1", now.Add(-time.Hour)), []byte(r.secret)), map[string]int{"amount_cents": 1}, 401},
		{"no-exp-401", "POST", deposit("1"), sign(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: "1"}, []byte(r.secret)), map[string]int{"amount_cents": 1}, 401},
		{"issued-in-the-future-401", "POST", deposit("1"), sign(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: "1",
			IssuedAt: jwt.NewNumericDate(now.Add(time.Hour)), ExpiresAt: jwt.NewNumericDate(now.Add(2 * time.Hour))}, []byte(r.secret)), map[string]int{"amount_cents": 1}, 401},
		{"lifetime-of-a-year-401", "POST", deposit("1"), sign(jwt.SigningMethodHS256, claims("1", now.Add(365*24*time.Hour)), []byte(r.secret)), map[string]int{"amount_cents": 1}, 401},
		{"sub-with-a-leading-zero-401", "POST", deposit("1"), sign(jwt.SigningMethodHS256, claims("01", now.Add(time.Hour)), []byte(r.secret)), map[string]int{"amount_cents": 1}, 401},
		{"sub-with-a-plus-sign-401", "POST", deposit("1"), sign(jwt.SigningMethodHS256, claims("+1", now.Add(time.Hour)), []byte(r.secret)), map[string]int{"amount_cents": 1}, 401},
		{"wrong-secret-401", "POST", deposit("1"), sign(jwt.SigningMethodHS256, valid, []byte(strings.Repeat("x", 32))), map[string]int{"amount_cents": 1}, 401},
		{"tampered-signature-401", "POST", deposit("1"), parts[0] + "." + parts[1] + "." + strings.Repeat("A", len(parts[2])), map[string]int{"amount_cents": 1}, 401},
		{"tampered-sub-401", "POST", deposit("2"), parts[0] + "." + jwtSegment(t, claims("2", now.Add(time.Hour))) + "." + parts[2], map[string]int{"amount_cents": 1}, 401},
		{"other-users-deposit-403", "POST", deposit("2"), good, map[string]int{"amount_cents": 1}, 403},
		{"other-users-withdraw-403", "POST", "/api/v1/accounts/2/withdraw", good, map[string]int{"amount_cents": 1}, 403},
		{"other-users-balance-403", "GET", "/api/v1/accounts/2", good, nil, 403},
		{"transfer-from-another-403", "POST", "/api/v1/transfers", good, map[string]int{"from": 2, "to": 1, "amount_cents": 1}, 403},
		{"admin-without-token-401", "POST", "/admin/v1/accounts", "", map[string]int{"id": 1, "balance_cents": 9}, 401},
		{"admin-with-user-token-401", "POST", "/admin/v1/accounts", good, map[string]int{"id": 1, "balance_cents": 9}, 401},
		{"admin-with-wrong-token-401", "POST", "/admin/v1/reset", r.admin + "x", nil, 401},
		{"admin-audit-with-user-token-401", "GET", "/admin/v1/audit", good, nil, 401},
		{"admin-token-as-user-401", "POST", deposit("1"), r.admin, map[string]int{"amount_cents": 1}, 401},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			res, err := r.client.Do(context.Background(), c.method, shop.URL+c.path, c.token, c.body)
			if err != nil {
				t.Fatal(err)
			}
			if res.Status != c.want || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json") {
				t.Errorf("%d %s (%s); want %d problem+json", res.Status, res.Body, res.Header.Get("Content-Type"), c.want)
			}
			if c.want == 401 && !strings.HasPrefix(res.Header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 without a Bearer challenge: %q", res.Header.Get("WWW-Authenticate"))
			}
		})
	}

	for _, id := range []string{"1", "2"} {
		tok := r.token(map[string]int64{"1": 1, "2": 2}[id])
		var a struct {
			Balance int64 `json:"balance_cents"`
		}
		r.client.Must(t, http.StatusOK, "GET", shop.URL+"/api/v1/accounts/"+id, tok, nil).JSON(t, &a)
		if a.Balance != opening {
			t.Errorf("account %s balance %d after the refused requests; want %d", id, a.Balance, opening)
		}
	}
	if audit := r.audit(shop.URL); !audit.OK {
		t.Errorf("audit after the refused requests: %+v", audit)
	}
}

// jwtSegment is the base64url JSON of claims, to splice into a token whose
// signature was made for other claims.
func jwtSegment(t *testing.T, c jwt.Claims) string {
	t.Helper()
	s, err := jwt.NewWithClaims(jwt.SigningMethodHS256, c).SigningString()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(s, ".")[1]
}
