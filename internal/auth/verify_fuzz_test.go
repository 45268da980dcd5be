package auth

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"strconv"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
)

const fuzzSecret = "auth-fuzz-secret-of-at-least-32-bytes!!"

// FuzzVerify feeds Verify arbitrary tokens. It must never panic, and it may
// accept only what an independent check accepts: an HS256 signature with
// the secret, an exp in the future (within the leeway), and a positive
// integer sub that is the id returned. Seeds include the classic attacks:
// alg none, RS256, HS256 keyed with an RSA public key, expired, tampered.
func FuzzVerify(f *testing.F) {
	a := New([]byte(fuzzSecret), "admin")
	now := time.Now()
	good, _ := a.Token(7, time.Hour, now)
	f.Add(good)
	f.Add(good[:len(good)-2] + "xx")
	expired, _ := a.Token(7, time.Minute, now.Add(-time.Hour))
	f.Add(expired)
	claims := jwt.RegisteredClaims{Subject: "7", ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour))}
	none, _ := jwt.NewWithClaims(jwt.SigningMethodNone, claims).SignedString(jwt.UnsafeAllowNoneSignatureType)
	f.Add(none)
	key, _ := rsa.GenerateKey(rand.Reader, 2048)
	rs, _ := jwt.NewWithClaims(jwt.SigningMethodRS256, claims).SignedString(key)
	f.Add(rs)
	der, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	pub := pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})
	confused, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(pub)
	f.Add(confused)
	other, _ := New([]byte("another-secret-of-at-least-32-bytes!!!"), "").Token(7, time.Hour, now)
	f.Add(other)
	noExp, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: "7"}).SignedString([]byte(fuzzSecret))
	f.Add(noExp)
	badSub, _ := jwt.NewWithClaims(jwt.SigningMethodHS256, jwt.RegisteredClaims{Subject: "-1",
		ExpiresAt: jwt.NewNumericDate(now.Add(time.Hour))}).SignedString([]byte(fuzzSecret))
	f.Add(badSub)
	hs512, _ := jwt.NewWithClaims(jwt.SigningMethodHS512, claims).SignedString([]byte(fuzzSecret))
	f.Add(hs512)
	f.Add("")
	f.Add("a.b.c")

	f.Fuzz(func(t *testing.T, token string) {
		id, err := a.Verify(token)
		if err != nil {
			if id != 0 {
				t.Fatalf("refused with id %d", id)
			}
			return
		}
		var c jwt.RegisteredClaims
		_, perr := jwt.ParseWithClaims(token, &c, func(tok *jwt.Token) (any, error) {
			if tok.Method != jwt.SigningMethodHS256 {
				t.Fatalf("accepted a token signed with %v", tok.Method.Alg())
			}
			return []byte(fuzzSecret), nil
		}, jwt.WithExpirationRequired(), jwt.WithLeeway(leeway))
		if perr != nil {
			t.Fatalf("accepted a token (id %d) that an independent check refuses: %v", id, perr)
		}
		if sub, err := strconv.ParseInt(c.Subject, 10, 64); err != nil || sub != id || id <= 0 {
			t.Fatalf("accepted sub %q as id %d", c.Subject, id)
		}
	})
}
