// Package auth authenticates shop's callers: users by an HS256 JWT whose
// subject is their user id (which is also their account id), operators by a
// static admin token.
package auth

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/golang-jwt/jwt/v5"

	"github.com/lockbench/shop/internal/problem"
)

// leeway absorbs clock skew between the issuer and this instance.
const leeway = 30 * time.Second

const userKey = "auth.user"

var hs256 = jwt.SigningMethodHS256.Alg()

// DefaultMaxLifetime is the longest a user token may live when
// MaxLifetime is not given: a day, the default of `shop token`.
const DefaultMaxLifetime = 24 * time.Hour

// Auth checks user tokens and the admin token. It is safe for concurrent use.
type Auth struct {
	secret      []byte
	maxLifetime time.Duration
	// adminHash is the SHA-256 of the admin token: comparing two hashes of
	// fixed length in constant time leaks neither the token's bytes nor its
	// length, which subtle.ConstantTimeCompare on raw strings would.
	adminHash [32]byte
}

// Option changes an Auth from its defaults.
type Option func(*Auth)

// MaxLifetime is the longest a user token may live, from its iat (or, a
// token without one, from now) to its exp.
func MaxLifetime(d time.Duration) Option { return func(a *Auth) { a.maxLifetime = d } }

// New returns an Auth that verifies user tokens with secret (HS256) and
// admin requests against adminToken.
func New(secret []byte, adminToken string, opts ...Option) *Auth {
	a := &Auth{secret: secret, maxLifetime: DefaultMaxLifetime, adminHash: sha256.Sum256([]byte(adminToken))}
	for _, o := range opts {
		o(a)
	}
	return a
}

// Token mints a user token for user, valid for ttl from now.
func (a *Auth) Token(user int64, ttl time.Duration, now time.Time) (string, error) {
	if user <= 0 {
		return "", fmt.Errorf("auth: user id must be positive, got %d", user)
	}
	if ttl > a.maxLifetime {
		return "", fmt.Errorf("auth: a token's lifetime may be at most %s (SHOP_JWT_MAX_TTL), not %s", a.maxLifetime, ttl)
	}
	claims := jwt.RegisteredClaims{
		Subject:   strconv.FormatInt(user, 10),
		IssuedAt:  jwt.NewNumericDate(now),
		ExpiresAt: jwt.NewNumericDate(now.Add(ttl)),
	}
	return jwt.NewWithClaims(jwt.SigningMethodHS256, claims).SignedString(a.secret)
}

// Verify returns the user id of a valid token: signed with HS256 and this
// secret, not expired, with exp present, not issued in the future, living
// no longer than the maximum lifetime, and a sub that is a positive user id
// in its one decimal spelling. Any other algorithm, none included, is
// refused before the signature is looked at, so a token cannot choose how
// it is checked. The lifetime is bounded so that a token leaked or minted
// with a stolen secret does not work for years; an iat in the future would
// stretch it past that bound.
func (a *Auth) Verify(token string) (int64, error) {
	var claims jwt.RegisteredClaims
	parsed, err := jwt.ParseWithClaims(token, &claims, func(*jwt.Token) (any, error) { return a.secret, nil },
		jwt.WithValidMethods([]string{hs256}),
		jwt.WithExpirationRequired(),
		jwt.WithIssuedAt(),
		jwt.WithLeeway(leeway),
	)
	// The library reports a refused algorithm as an invalid signature;
	// the token's own header tells the two apart.
	var wrongAlg bool
	if parsed != nil {
		alg, ok := parsed.Header["alg"].(string)
		wrongAlg = ok && alg != hs256
	}
	switch {
	case err != nil && wrongAlg,
		errors.Is(err, jwt.ErrTokenUnverifiable):
		return 0, errors.New("the token's algorithm is not accepted; only HS256 is")
	case errors.Is(err, jwt.ErrTokenExpired):
		return 0, errors.New("the token has expired")
	case errors.Is(err, jwt.ErrTokenUsedBeforeIssued):
		return 0, errors.New("the token was issued in the future (iat); check the issuer's clock")
	case errors.Is(err, jwt.ErrTokenRequiredClaimMissing):
		return 0, errors.New("the token has no exp claim")
	case errors.Is(err, jwt.ErrTokenSignatureInvalid):
		return 0, errors.New("the token's signature is invalid")
	case errors.Is(err, jwt.ErrTokenMalformed):
		return 0, errors.New("the token is malformed")
	case err != nil:
		return 0, errors.New("the token is invalid")
	}
	if err := a.checkLifetime(claims); err != nil {
		return 0, err
	}
	// One spelling per user: "07" or "+7" parsed as 7 would let a token
	// name a user in a form nothing else in the service compares equal.
	id, err := strconv.ParseInt(claims.Subject, 10, 64)
	if err != nil || id <= 0 || strconv.FormatInt(id, 10) != claims.Subject {
		return 0, fmt.Errorf("the token's sub must be a positive integer user id in decimal without sign or leading zeros, got %q", claims.Subject)
	}
	return id, nil
}

// checkLifetime refuses a token that lives longer than the maximum: from
// its iat to its exp, or from now when it has no iat.
func (a *Auth) checkLifetime(claims jwt.RegisteredClaims) error {
	if claims.IssuedAt != nil {
		if life := claims.ExpiresAt.Sub(claims.IssuedAt.Time); life > a.maxLifetime {
			return fmt.Errorf("the token's lifetime (iat to exp) is %s; at most %s is accepted", life, a.maxLifetime)
		}
		return nil
	}
	if left := time.Until(claims.ExpiresAt.Time); left > a.maxLifetime+leeway {
		return fmt.Errorf("the token has no iat and expires in %s; its lifetime may be at most %s", left.Round(time.Second), a.maxLifetime)
	}
	return nil
}

// User is middleware that admits requests with a valid user token and
// records the user id for UserID. Others get 401 with WWW-Authenticate.
func (a *Auth) User() gin.HandlerFunc {
	return func(c *gin.Context) {
		token, perr := bearer(c, "send Authorization: Bearer <token>; `shop token <user>` prints one")
		if perr != nil {
			problem.Write(c, perr)
			return
		}
		id, err := a.Verify(token)
		if err != nil {
			problem.Write(c, unauthorized(err.Error(), "invalid_token"))
			return
		}
		c.Set(userKey, id)
		c.Next()
	}
}

// Admin is middleware that admits requests bearing the admin token.
func (a *Auth) Admin() gin.HandlerFunc {
	return func(c *gin.Context) {
		token, perr := bearer(c, "send Authorization: Bearer <SHOP_ADMIN_TOKEN>")
		if perr != nil {
			problem.Write(c, perr)
			return
		}
		got := sha256.Sum256([]byte(token))
		if subtle.ConstantTimeCompare(got[:], a.adminHash[:]) != 1 {
			problem.Write(c, unauthorized("the admin token is wrong", "invalid_token"))
			return
		}
		c.Next()
	}
}

// UserID is the authenticated user of a request that passed User.
func UserID(c *gin.Context) int64 { return c.GetInt64(userKey) }

// RequireSelf refuses (403) a user acting on an account that is not theirs.
// It is checked before the account is looked up, so that a 404 never tells
// one user whether another's account exists.
func RequireSelf(c *gin.Context, account int64) error {
	if user := UserID(c); user != account {
		return problem.New(http.StatusForbidden, "forbidden",
			fmt.Sprintf("user %d may act only on account %d, not %d", user, user, account))
	}
	return nil
}

// bearer is the token of the request's one Authorization header, or a 401
// that says missing when there is none. Two or more are refused, since
// either could be meant (RFC 9110 §5.3 allows no list in this field).
func bearer(c *gin.Context, missing string) (string, *problem.Error) {
	if n := len(c.Request.Header.Values("Authorization")); n > 1 {
		return "", unauthorized(fmt.Sprintf("send one Authorization header, not %d", n), "invalid_request")
	}
	scheme, token, ok := strings.Cut(c.GetHeader("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") || strings.TrimSpace(token) == "" {
		return "", unauthorized(missing, "")
	}
	return strings.TrimSpace(token), nil
}

func unauthorized(detail, code string) *problem.Error {
	challenge := `Bearer realm="shop"`
	if code != "" {
		challenge += fmt.Sprintf(`, error=%q`, code) // RFC 6750 section 3
	}
	e := problem.New(http.StatusUnauthorized, "unauthorized", detail)
	e.Header = http.Header{"Www-Authenticate": {challenge}}
	return e
}
