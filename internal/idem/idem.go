// Package idem makes unsafe requests safe to retry, following the IETF
// Idempotency-Key draft (draft-ietf-httpapi-idempotency-key-header) and
// Stripe's implementation of it. docs/api.md#idempotency is the client's
// view; this is the wiring's.
//
// The guards, one record per key:
//
//   - Middleware() requires a token minted by POST /api/v1/idempotency-tokens
//     (seed 000's scheme), for routes whose first call creates a row with no
//     business number: POST /api/v1/orders. No header is 400; a key that was
//     never minted for this user, or has expired, is 422
//     idempotency-key-unknown.
//
//   - Optional() takes a key the client chose (a UUID, say), or none: the
//     money-moving POSTs (deposit, withdraw, transfer, seckill purchase).
//     Without the header the request runs as a plain POST.
//
//   - Guard(Policy{...}) is either, with the choice of RerunServerErrors.
//     An order's payment takes the client's optional key and re-runs after
//     a 5xx, because paying a paid order answers the same:
//
//     api.POST("/orders/:id/pay", d.Idem.Guard(idem.Policy{RerunServerErrors: true}), d.pay)
//
// All scope keys per user (the JWT's subject): one user's key never meets
// another's. A key is 1 to 255 characters, bare (Stripe) or as a Structured
// Field string (the draft); an empty, blank, over-long or non-ASCII key is
// 400 idempotency-key-invalid.
//
// The first request with a key binds the key to its fingerprint (method,
// path, query, user and the body as canonical JSON: key order, whitespace
// and the spelling of numbers do not matter; a body naming a member twice,
// also only by case, is compared byte for byte), runs, and its response is
// stored on the key. A retry gets that response again (status, body,
// Content-Type, Location, Cache-Control) with Idempotent-Replayed: true, a
// new X-Request-Id, and Idempotency-Replayed-Request-Id naming the request
// that produced it (the request_id a problem body carries). The same key
// with another fingerprint is 422 idempotency-key-reused; the same key
// while its first request runs is 409 idempotency-key-in-use.
//
// The proof that a keyed change happened is in the database, not in Redis:
// the store that writes a change calls keyed.Save in the change's
// transaction, and a keyed.Record (user and key as primary key,
// fingerprint, status, headers, body: the answer the handler decided with
// keyed.Decide) commits with the change or not at all. A request that
// Redis lets run looks for that record first and replays it (a commit
// whose reply was lost, a record Redis lost); a
// second run of one key cannot commit, its record colliding on the key.
//
// Which responses are stored in Redis: every response of a request that
// ran, errors included (sold out, insufficient funds), 500 included (as
// Stripe does: a 500 may come after a write that landed, and running the
// request again could move money twice), except
//   - 503: this service answers 503 when nothing was changed (a busy or
//     lost lock, a fenced write, a dependency down, shutting down) and asks
//     for the retry that a stored 503 would refuse, or when the database's
//     reply to a COMMIT was lost (outcome-unknown): then the change's
//     Record answers the retry;
//   - 400, 408, 413, 415, 429: refused before it ran, so the client may fix
//     the request and send it again with the same key;
//   - with Policy{RerunServerErrors: true}, every 5xx: for handlers whose own
//     write records the key, so that running again finds the first outcome;
//   - responses whose handler called DoNotStore.
//
// Bounded memory: every key idem writes has a TTL. A record lives as long
// as the token it was minted as, or Options.TTL from its first request for
// a client's key; the in-flight lease lives Options.Lease and is renewed
// while its request runs, so that a crash blocks the key for one lease at
// most. The lease is fenced by the record's own run number, not by a lock's
// counter: a run whose lease lapsed and whose key was claimed again cannot
// store or free it. Each claim carries an id of its own, kept on the
// record: go-redis sends a script again when its connection drops before
// the reply, and the resend of a claim that ran finds its own id and runs
// the request, instead of answering 409 for a lease nobody else holds.
// Minting (the token is named before the script) and the scripts fenced
// by the run number are idempotent as they stand. A user holds at most
// Options.MaxTokens live tokens;
// minting more is 429 idempotency-tokens-exhausted with Retry-After. The
// database's records outlive Redis's by a little: RunPruner deletes those
// older than Options.TTL, on one instance at a time.
//
// Redis layout (one hash slot per user, so that it works on a Cluster):
//
//	<prefix>idem:{<user>}:<sha256(key)[:32]>      the record (hash)
//	<prefix>idem:{<user>}:<sha256(key)[:32]>:run  its in-flight lease
//	<prefix>idem:{<user>}:tokens                  the user's live minted tokens (sorted set)
package idem

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/base64"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/idem/keyed"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/backend"
)

// Header names.
const (
	// KeyHeader carries the key on the request.
	KeyHeader = "Idempotency-Key"
	// ReplayedHeader is "true" on a stored response sent again.
	ReplayedHeader = "Idempotent-Replayed"
	// ReplayedRequestIDHeader names, on a replay, the request whose
	// response it is.
	ReplayedRequestIDHeader = "Idempotency-Replayed-Request-Id"
)

// DefaultTTL is how long a record lives, unless Options.TTL says
// otherwise: a minted token from its minting, used or not; a client's key
// from its first request. A retry later than that runs again (a client's
// key) or gets 422 idempotency-key-unknown (a token), and should look the
// outcome up instead.
const DefaultTTL = 24 * time.Hour

// DefaultMaxTokens is how many live tokens a user may hold, unless
// Options.MaxTokens says otherwise. At DefaultTTL that is about one order
// every 86 s, all day, per user; a minted token costs about 200 bytes of
// Redis until it expires, plus the response stored on it.
const DefaultMaxTokens = 1000

// DefaultLease is how long a crashed request blocks its key; a live one
// renews its lease every third of it.
const DefaultLease = 30 * time.Second

var (
	//go:embed issue.lua
	issueLua string
	//go:embed claim.lua
	claimLua string
	//go:embed renew.lua
	renewLua string
	//go:embed store.lua
	storeLua string
	//go:embed release.lua
	releaseLua string

	issueScript   = redis.NewScript(issueLua)
	claimScript   = redis.NewScript(claimLua)
	renewScript   = redis.NewScript(renewLua)
	storeScript   = redis.NewScript(storeLua)
	releaseScript = redis.NewScript(releaseLua)
)

// ErrUnknownKey means a token that was never minted for this user or has
// expired.
var ErrUnknownKey = errors.New("idempotency key unknown")

// TokensExhaustedError is Issue's refusal when the user holds
// Options.MaxTokens live tokens; RetryAfter is when the oldest expires.
type TokensExhaustedError struct {
	Max        int
	RetryAfter time.Duration
}

func (e *TokensExhaustedError) Error() string {
	return fmt.Sprintf("you hold %d live idempotency tokens, the most allowed; use them, or mint more once the oldest expires (in %s)",
		e.Max, e.RetryAfter.Round(time.Second))
}

// tokenPattern is what Issue produces: 22 base64url characters (128 random
// bits). Anything else is unknown to Middleware without asking Redis.
var tokenPattern = regexp.MustCompile(`^[A-Za-z0-9_-]{22}$`)

// Token is an issued idempotency token.
type Token struct {
	Key       string    `json:"token"`
	ExpiresAt time.Time `json:"expires_at"`
}

// Options configure New.
type Options struct {
	// TTL is a record's lifetime; zero is DefaultTTL.
	TTL time.Duration
	// Lease is how long a request's claim on its key outlives the last
	// renewal; zero is DefaultLease.
	Lease time.Duration
	// MaxTokens caps the live tokens per user; zero is DefaultMaxTokens.
	MaxTokens int
	// Prefix namespaces the Redis keys (config SHOP_KEY_PREFIX).
	Prefix string
	// DB is the database of the guarded changes, which holds their
	// records (Save); a request whose key Redis does not know looks there
	// before it runs. Nil: Redis alone (tests of the Redis part).
	DB *gorm.DB
}

// Idem mints tokens and guards routes. It is safe for concurrent use.
type Idem struct {
	client redis.UniversalClient
	o      Options
	pruned prometheus.Counter
}

// New returns an Idem keeping its records in client (a single node, a
// Sentinel set or a Cluster).
func New(client redis.UniversalClient, o Options) (*Idem, error) {
	if client == nil {
		return nil, errors.New("idem: a Redis client is required")
	}
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.Lease <= 0 {
		o.Lease = DefaultLease
	}
	if o.MaxTokens <= 0 {
		o.MaxTokens = DefaultMaxTokens
	}
	return &Idem{client: client, o: o, pruned: newPrunedCounter()}, nil
}

// keys are a key's record and its lease. The key itself is hashed: it may
// hold any character, braces included, and Redis need not see it.
func (m *Idem) keys(user int64, key string) (record, lease string) {
	record = m.userTag(user) + keyed.KeyHash(key)
	return record, record + ":run"
}

func (m *Idem) userTag(user int64) string {
	return m.o.Prefix + "idem:{" + strconv.FormatInt(user, 10) + "}:"
}

// Issue mints a token bound to user, valid for the configured TTL, or
// returns a *TokensExhaustedError.
func (m *Idem) Issue(ctx context.Context, user int64) (Token, error) {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand, Go 1.24+)
	now := time.Now().UTC()
	// expires_at is when the client was told; Redis starts the TTL a little
	// later, so the token never dies before the time the client was given.
	t := Token{Key: base64.RawURLEncoding.EncodeToString(b), ExpiresAt: now.Add(m.o.TTL)}
	rec, _ := m.keys(user, t.Key)
	// The index scores by this instance's clock: instances whose clocks
	// differ by d count a token d early or late against the cap, no more.
	res, err := issueScript.Run(ctx, m.client, []string{m.userTag(user) + "tokens", rec},
		now.UnixMilli(), t.ExpiresAt.UnixMilli(), m.o.TTL.Milliseconds(), m.o.MaxTokens, keyed.KeyHash(t.Key)).Slice()
	if err != nil {
		return Token{}, fmt.Errorf("idem: issue: %w", err)
	}
	if len(res) == 2 {
		oldest, _ := strconv.ParseFloat(fmt.Sprint(res[1]), 64)
		wait := time.Duration(math.Max(0, oldest-float64(now.UnixMilli()))) * time.Millisecond
		return Token{}, &TokensExhaustedError{Max: m.o.MaxTokens, RetryAfter: wait}
	}
	return t, nil
}

// record is the part of a key's record that decides a request's answer.
type record struct {
	fp     string // fingerprint of the request that ran first; "" if none
	status int    // 0 until a response is stored
	header string // JSON of the stored headers
	body   string
	rid    string // X-Request-Id of the request that produced the response
}

// lookup reads the record of user's key from the database: what a
// request finds when Redis has no answer for it.
func (m *Idem) lookup(ctx context.Context, user int64, key string) (record, bool, error) {
	if m.o.DB == nil {
		return record{}, false, nil
	}
	var rows []keyed.Record
	err := m.o.DB.WithContext(ctx).Where("user_id = ? AND key_hash = ?", user, keyed.KeyHash(key)).Limit(1).Find(&rows).Error
	if err != nil || len(rows) == 0 {
		return record{}, false, err
	}
	r := rows[0]
	return record{fp: r.Fingerprint, status: r.Status, header: r.Header, body: r.Body, rid: r.RequestID}, true, nil
}

// verdict is claim's answer.
type verdict int

const (
	runIt verdict = iota
	decided
	unknownKey
	inUse
)

// claim decides, in one round trip, what the request with key and
// fingerprint fp does: run (with the run number that fences its record),
// answer from the record, or be refused.
func (m *Idem) claim(ctx context.Context, user int64, key, fp string, required bool) (v verdict, run string, rec record, err error) {
	if required && !tokenPattern.MatchString(key) {
		return unknownKey, "", record{}, nil
	}
	recKey, leaseKey := m.keys(user, key)
	req := "0"
	if required {
		req = "1"
	}
	res, err := claimScript.Run(ctx, m.client, []string{recKey, leaseKey},
		fp, m.o.Lease.Milliseconds(), m.o.TTL.Milliseconds(), req, rand.Text()).StringSlice()
	if err != nil {
		return 0, "", record{}, fmt.Errorf("idem: claim key: %w", err)
	}
	return parseClaim(res)
}

// parseClaim reads claim.lua's reply: a verdict, with the run number when
// it is "claimed" and the record's fields when it is "record".
func parseClaim(res []string) (v verdict, run string, rec record, err error) {
	if len(res) == 0 || (res[0] == "claimed" && len(res) < 2) || (res[0] == "record" && len(res) < 6) {
		return 0, "", record{}, fmt.Errorf("idem: claim key: unexpected reply %q", res)
	}
	switch res[0] {
	case "unknown":
		return unknownKey, "", record{}, nil
	case "in-use":
		return inUse, "", record{}, nil
	case "claimed":
		return runIt, res[1], record{}, nil
	}
	rec = record{fp: res[1], header: res[3], body: res[4], rid: res[5]}
	if res[2] != "" {
		if rec.status, err = strconv.Atoi(res[2]); err != nil {
			return 0, "", record{}, fmt.Errorf("idem: record has status %q: %w", res[2], err)
		}
	}
	return decided, "", rec, nil
}

// runLease is a running request's hold on its key, kept by lockkit's lease
// machinery rather than a watchdog of idem's own: renewed every third of
// Options.Lease, and lost once a renewal finds the key claimed by a later
// run, or once a whole lease has passed since the last renewal that was
// sent and applied. The lease is not a lock: it is fenced by the record's
// run, not by a counter (so its Fence is 0), and it ends by storing the
// response or freeing the key, which run does after end.
type runLease struct {
	lockkit.Lease
	mu sync.Mutex
	// ended: the request finished; no renewal may land after this, or it
	// would set the lease again on a key just stored or freed.
	ended bool
	// claimedAgain: a renewal found the record naming a later run.
	claimedAgain bool
}

// lease starts the lease of run on recKey, claimed at claimed (Redis
// started it later than that, so claimed+Lease is never late).
func (m *Idem) lease(recKey, leaseKey, run string, claimed time.Time) *runLease {
	r := &runLease{}
	r.Lease = backend.NewLease(backend.Grant{
		Key: leaseKey, TTL: m.o.Lease, Watchdog: true, Sent: claimed,
		Extend: func(ctx context.Context, ttl time.Duration) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.ended {
				return lockkit.ErrNotHeld
			}
			ok, err := renewScript.Run(ctx, m.client, []string{recKey, leaseKey}, run, ttl.Milliseconds()).Int()
			switch {
			case err != nil:
				// Transient: the next tick tries again, and the lease is lost
				// if none succeeds in time.
				return err
			case ok == 0:
				r.claimedAgain = true
				return lockkit.ErrNotHeld
			}
			return nil
		},
		// Nothing to free here: run stores the response or frees the key.
		Release: func(context.Context) error { return nil },
	})
	return r
}

// why is the reason the lease was lost, for the log.
func (r *runLease) why() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.claimedAgain {
		return "the key was claimed again"
	}
	return "no renewal for a whole lease"
}

// end stops the renewals, waiting for one in flight: after end, nothing
// renews the lease in Redis.
func (r *runLease) end(ctx context.Context) {
	_ = r.Release(ctx) // cancels a renewal in flight
	r.mu.Lock()
	r.ended = true
	r.mu.Unlock()
}
