package auth

import (
	"crypto/rand"
	"crypto/rsa"
	"strings"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

// TestVerifyNamesTheFault: each refusal says what is wrong with the token.
// The algorithm cases are told apart by the token's own header, not by the
// wording of the library's error messages, which may change in any release.
func TestVerifyNamesTheFault(t *testing.T) {
	a := New([]byte(fuzzSecret), "admin")
	now := time.Now()
	valid := jwt.RegisteredClaims{Subject: "7", ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour))}
	sign := func(m jwt.SigningMethod, key any, c jwt.Claims) string {
		s, err := jwt.NewWithClaims(m, c).SignedString(key)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	rsaKey, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	good := sign(jwt.SigningMethodHS256, []byte(fuzzSecret), valid)
	for _, tc := range []struct {
		name, token, want string
	}{
		{"hs512", sign(jwt.SigningMethodHS512, []byte(fuzzSecret), valid), "algorithm is not accepted"},
		{"none", sign(jwt.SigningMethodNone, jwt.UnsafeAllowNoneSignatureType, valid), "algorithm is not accepted"},
		{"rs256", sign(jwt.SigningMethodRS256, rsaKey, valid), "algorithm is not accepted"},
		{"unknown-alg", `eyJhbGciOiJYWVoiLCJ0eXAiOiJKV1QifQ` + good[strings.Index(good, "."):], "algorithm is not accepted"},
		{"forged", sign(jwt.SigningMethodHS256, []byte("another-secret-0123456789abcdef0123"), valid), "signature is invalid"},
		{"tampered", good[:len(good)-2] + "xx", "signature is invalid"},
		{"expired", sign(jwt.SigningMethodHS256, []byte(fuzzSecret), jwt.RegisteredClaims{Subject: "7", ExpiresAt: jwt.NewNumericDate(now.Add(-time.Hour))}), "expired"},
		{"no-exp", sign(jwt.SigningMethodHS256, []byte(fuzzSecret), jwt.RegisteredClaims{Subject: "7"}), "no exp"},
		{"malformed", "not.a.jwt", "malformed"},
		{"bad-sub", sign(jwt.SigningMethodHS256, []byte(fuzzSecret), jwt.RegisteredClaims{Subject: "x", ExpiresAt: valid.ExpiresAt}), "sub must be"},
		// One user, one spelling: 07 and +7 are not user 7.
		{"sub-leading-zero", sign(jwt.SigningMethodHS256, []byte(fuzzSecret), jwt.RegisteredClaims{Subject: "07", ExpiresAt: valid.ExpiresAt}), "sub must be"},
		{"sub-plus-sign", sign(jwt.SigningMethodHS256, []byte(fuzzSecret), jwt.RegisteredClaims{Subject: "+7", ExpiresAt: valid.ExpiresAt}), "sub must be"},
		{"issued-in-the-future", sign(jwt.SigningMethodHS256, []byte(fuzzSecret), jwt.RegisteredClaims{Subject: "7",
			IssuedAt: jwt.NewNumericDate(now.Add(leeway + time.Minute)), ExpiresAt: jwt.NewNumericDate(now.Add(2 * time.Hour))}), "issued in the future"},
		{"lifetime-over-the-maximum", sign(jwt.SigningMethodHS256, []byte(fuzzSecret), jwt.RegisteredClaims{Subject: "7",
			IssuedAt: jwt.NewNumericDate(now), ExpiresAt: jwt.NewNumericDate(now.Add(DefaultMaxLifetime + time.Hour))}), "lifetime"},
		{"expiry-too-far-without-iat", sign(jwt.SigningMethodHS256, []byte(fuzzSecret), jwt.RegisteredClaims{Subject: "7",
			ExpiresAt: jwt.NewNumericDate(now.Add(DefaultMaxLifetime + time.Hour))}), "lifetime"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := a.Verify(tc.token); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Verify: %v; want %q", err, tc.want)
			}
		})
	}
	if id, err := a.Verify(good); err != nil || id != 7 {
		t.Errorf("good token: %d, %v", id, err)
	}
}

// TestMaxLifetimeIsConfigurable: a token may live as long as the
// configured maximum and no longer, and Token refuses to mint one that
// Verify would refuse.
func TestMaxLifetimeIsConfigurable(t *testing.T) {
	a := New([]byte(fuzzSecret), "admin", MaxLifetime(2*time.Hour))
	now := time.Now()
	tok, err := a.Token(7, 2*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Verify(tok); err != nil {
		t.Errorf("a token of the maximum lifetime: %v", err)
	}
	if _, err := a.Token(7, 3*time.Hour, now); err == nil || !strings.Contains(err.Error(), "lifetime") {
		t.Errorf("minting a token over the maximum lifetime: %v", err)
	}
	long, err := New([]byte(fuzzSecret), "admin", MaxLifetime(4*time.Hour)).Token(7, 3*time.Hour, now)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Verify(long); err == nil || !strings.Contains(err.Error(), "lifetime") {
		t.Errorf("a token over the maximum lifetime: %v, want refused", err)
	}
}
