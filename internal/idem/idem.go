// Package idem makes unsafe requests safe to retry, following the IETF
// Idempotency-Key draft (draft-ietf-httpapi-idempotency-key-header) and
// Stripe's implementation of it.
//
// A client asks POST /api/v1/idempotency-tokens for a one-time token, then
// sends it as the Idempotency-Key header of the request it may retry. The
// first request with the token runs, under lock:idem:<user>:<token> taken
// with TryAcquire, and its response is stored on the token with the
// request's fingerprint (method, path, SHA-256 of the body). A retry gets the
// stored response again, byte for byte, with Idempotent-Replayed: true.
//
// Answers of the middleware itself (all RFC 9457 problem+json):
//   - 400 idempotency-key-missing: no Idempotency-Key header.
//   - 422 idempotency-key-unknown: the token was never issued, has expired,
//     or was issued to another user. The three look alike on purpose: a
//     caller learns nothing about other users' tokens. 422 and not 404: the
//     resource exists, the request's content (this header) is what cannot
//     be processed; and not 403, which would confirm the token exists.
//   - 422 idempotency-key-reused: the token was used for another request
//     (another method, path or body), as the draft and Stripe answer.
//   - 409 idempotency-key-in-use: a request with this token is running. A
//     duplicate does not wait (TryAcquire), and nothing is stored for it.
//
// Which responses are stored (the token is then spent): every response of a
// request that ran, errors included (sold out, insufficient funds), except
//   - 5xx: the failure was on the server's side (a busy lock, a database
//     down) and the handler changed nothing or left it for reconciliation;
//     the token is freed and a retry runs again (Stripe does the same);
//   - 400, 408, 413, 415, 429: the request was refused before it ran, so
//     the client may fix it and send it again with the same token;
//   - responses whose handler called DoNotStore.
//
// A crash mid-request does not block the token for ever: the in-flight
// marker is the lock's lease, which expires (lockkit.DefaultLeaseTTL, 30 s,
// unless LockOptions say otherwise) once its holder stops renewing it.
package idem

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	_ "embed"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
)

// Header names.
const (
	// KeyHeader carries the token on the request.
	KeyHeader = "Idempotency-Key"
	// ReplayedHeader is "true" on a stored response sent again.
	ReplayedHeader = "Idempotent-Replayed"
	// ReplayedRequestIDHeader names, on a replay, the request whose
	// response it is.
	ReplayedRequestIDHeader = "Idempotency-Replayed-Request-Id"
)

// DefaultMaxTokens is how many live tokens a user may hold, unless
// Options.MaxTokens says otherwise.
const DefaultMaxTokens = 1000

// DefaultTTL is how long a token lives from its issue, used or not, unless
// Options.TTL says otherwise. A retry later than that gets 422
// idempotency-key-unknown and must look the outcome up instead.
const DefaultTTL = 24 * time.Hour

var (
	//go:embed store.lua
	storeLua string
	//go:embed claim.lua
	claimLua string
	//go:embed unclaim.lua
	unclaimLua string

	storeScript   = redis.NewScript(storeLua)
	claimScript   = redis.NewScript(claimLua)
	unclaimScript = redis.NewScript(unclaimLua)
)

// ErrUnknownKey means a token that was never issued to this user or has
// expired.
var ErrUnknownKey = errors.New("idempotency key unknown")

// tokenPattern is what Issue produces: 22 base64url characters (128 random
// bits). Anything else is unknown without asking Redis.
var tokenPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)

// Token is an issued idempotency token.
type Token struct {
	Key       string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Options configure New.
type Options struct {
	// Locker holds the in-flight marker, lock:idem:<user>:<token>.
	Locker lockkit.Locker
	// LockOptions are passed to TryAcquire. Without a TTL the lease is
	// renewed while the request runs and expires 30 s after a crash.
	LockOptions []lockkit.Option
	// TTL is a token's lifetime; zero is DefaultTTL.
	TTL time.Duration
	// Prefix namespaces the Redis keys (config SHOP_KEY_PREFIX).
	Prefix string
}

// Idem issues tokens and replays responses. It is safe for concurrent use.
type Idem struct {
	client redis.UniversalClient
	o      Options
}

// New returns an Idem keeping tokens in client (a single node or a
// Cluster: each token is one key).
func New(client redis.UniversalClient, o Options) (*Idem, error) {
	if o.Locker == nil {
		return nil, errors.New("idem: a Locker is required for the in-flight marker")
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	return &Idem{client: client, o: o}, nil
}

func (m *Idem) key(user int64, token string) string {
	return m.o.Prefix + "idem:" + strconv.FormatInt(user, 10) + ":" + token
}

// LockKey is the lock key of a token's in-flight marker.
func LockKey(user int64, token string) string {
	return "lock:idem:" + strconv.FormatInt(user, 10) + ":" + token
}

// Issue creates a token bound to user, valid for the configured TTL.
func (m *Idem) Issue(ctx context.Context, user int64) (Token, error) {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand, Go 1.24+)
	now := time.Now().UTC()
	// expires_at is when the client was told; Redis starts the TTL a little
	// later, so the token never dies before the time the client was given.
	t := Token{Key: base64.RawURLEncoding.EncodeToString(b), ExpiresAt: now.Add(m.o.TTL)}
	k := m.key(user, t.Key)
	_, err := m.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, k, "issued", now.Format(time.RFC3339Nano))
		p.PExpire(ctx, k, m.o.TTL)
		return nil
	})
	if err != nil {
		return Token{}, fmt.Errorf("idem: issue: %w", err)
	}
	return t, nil
}

// record is a token's state in Redis.
type record struct {
	fp     string // fingerprint of the request that ran first; "" if none yet
	status int    // 0 until a response is stored
	header string // JSON of the stored headers
	body   string
}

func (m *Idem) load(ctx context.Context, user int64, token string) (record, error) {
	if !tokenPattern.MatchString(token) {
		return record{}, ErrUnknownKey
	}
	h, err := m.client.HGetAll(ctx, m.key(user, token)).Result()
	if err != nil {
		return record{}, fmt.Errorf("idem: read token: %w", err)
	}
	return parseRecord(h)
}

// claim binds the token to the request with fingerprint fp, in the same
// step as it reads the record again under the token's lock (the first
// request may have finished between the unlocked read and the grant). It
// returns claimed, or the record that decides the answer instead.
func (m *Idem) claim(ctx context.Context, user int64, token, fp string) (rec record, claimed bool, err error) {
	res, err := claimScript.Run(ctx, m.client, []string{m.key(user, token)}, fp).StringSlice()
	if err != nil {
		return record{}, false, fmt.Errorf("idem: claim token: %w", err)
	}
	h := make(map[string]string, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		h[res[i]] = res[i+1]
	}
	if h["claimed"] == "1" {
		return record{}, true, nil
	}
	rec, err = parseRecord(h)
	return rec, false, err
}

// parseRecord reads a token's record from its hash; an empty hash is a
// token that was never issued or has expired.
func parseRecord(h map[string]string) (record, error) {
	if len(h) == 0 {
		return record{}, ErrUnknownKey
	}
	var err error
	r := record{fp: h["fp"], header: h["header"], body: h["body"]}
	if s := h["status"]; s != "" {
		if r.status, err = strconv.Atoi(s); err != nil {
			return record{}, fmt.Errorf("idem: token record has status %q: %w", s, err)
		}
	}
	return r, nil
}

// fingerprint identifies a request: method, path (with query) and the
// SHA-256 of its body. Headers are left out: a retry may legitimately carry
// a new Authorization token or request id.
func fingerprint(method, path string, body []byte) string {
	sum := sha256.Sum256(body)
	h := sha256.Sum256([]byte(method + " " + path + " " + hex.EncodeToString(sum[:])))
	return hex.EncodeToString(h[:])
}

// parseKey accepts the draft's form, a Structured Field string
// ("Idempotency-Key: \"…\""), and Stripe's bare token.
func parseKey(raw string) string {
	raw = strings.TrimSpace(raw)
	if len(raw) >= 2 && raw[0] == '"' && raw[len(raw)-1] == '"' {
		raw = raw[1 : len(raw)-1]
	}
	return raw
}
