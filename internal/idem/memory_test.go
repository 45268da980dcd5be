package idem

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// liveKeys counts the fixture's keys in Redis, those without a TTL, and
// the longest TTL; a key that expired but was not yet reclaimed is not
// counted.
func (f *fixture) liveKeys() (all, noTTL int, longest time.Duration) {
	f.t.Helper()
	ctx := context.Background()
	scan(ctx, f.t, f.client, f.prefix+"*", func(c redis.UniversalClient, key string) {
		ttl, err := c.PTTL(ctx, key).Result()
		if err != nil {
			f.t.Fatal(err)
		}
		switch {
		case ttl == -2: // expired meanwhile
		case ttl < 0:
			all++
			noTTL++
		default:
			all++
			longest = max(longest, ttl)
		}
	})
	return all, noTTL, longest
}

// TestThousandKeyedRequestsBoundedMemory: 1,000 keyed requests (half on
// minted tokens, half on the client's own keys, each retried once, some
// refused and run again) leave nothing in Redis without a TTL, nothing that
// outlives the records' TTL, and no more keys than the live records need:
// one per key, plus the user's token index.
func TestThousandKeyedRequestsBoundedMemory(t *testing.T) {
	onBoth(t, func(t *testing.T, client func(testing.TB) redis.UniversalClient) {
		const ttl = time.Minute
		f := newFixtureOn(t, client(t), Options{TTL: ttl})
		const n, users = 1000, 4
		before, beforeNoTTL, _ := f.liveKeys()
		for i := range n {
			user := int64(1 + (i/2)%users)
			path, key := optional, fmt.Sprintf("client-key-%d", i)
			if i%2 == 0 {
				path, key = required, f.token(user)
			}
			body := `{"i":` + strconv.Itoa(i) + `}`
			if i%10 == 0 { // malformed: refused with 400, not stored, then sent right
				want(t, f.do("POST", path, user, key, `{"i":`), http.StatusBadRequest, "invalid-input")
			}
			first := f.do("POST", path, user, key, body)
			want(t, first, http.StatusCreated, `"got"`)
			wantReplay(t, first, f.do("POST", path, user, key, body))
		}
		after, afterNoTTL, longest := f.liveKeys()
		if afterNoTTL != beforeNoTTL {
			t.Errorf("keys without a TTL: %d before, %d after", beforeNoTTL, afterNoTTL)
		}
		if longest > ttl {
			t.Errorf("a key lives %s, longer than the records' TTL %s", longest, ttl)
		}
		if grew, need := after-before, n+users; grew != need {
			t.Errorf("%d keyed requests of %d users added %d keys; the live records need %d", n, users, grew, need)
		}
		t.Logf("%d keyed requests: %d keys before, %d after (%d without TTL), longest TTL %s", n, before, after, afterNoTTL, longest)
	})
}

// TestEverythingExpires: once the records' TTL has passed, nothing that
// keyed requests wrote is left.
func TestEverythingExpires(t *testing.T) {
	const ttl = 300 * time.Millisecond
	f := newFixture(t, Options{TTL: ttl})
	for i := range 50 {
		path, key := optional, fmt.Sprintf("k%d", i)
		if i%2 == 0 {
			path, key = required, f.token(1)
		}
		want(t, f.do("POST", path, 1, key, `{}`), http.StatusCreated, `"got"`)
	}
	if all, _, _ := f.liveKeys(); all == 0 {
		t.Fatal("no keys written")
	}
	time.Sleep(ttl + 100*time.Millisecond)
	if all, _, _ := f.liveKeys(); all != 0 {
		t.Fatalf("%d keys left after the TTL", all)
	}
}

// TestTokenMintingIsCapped: a user holds at most MaxTokens live tokens;
// the next is 429 with the wait until the oldest expires, and minting
// works again once it has.
func TestTokenMintingIsCapped(t *testing.T) {
	const ttl, maxTokens = 2 * time.Second, 5
	f := newFixture(t, Options{TTL: ttl, MaxTokens: maxTokens})
	for range maxTokens {
		f.token(1)
	}
	w := f.do("POST", "/api/v1/idempotency-tokens", 1, "", "")
	want(t, w, http.StatusTooManyRequests, "idempotency-tokens-exhausted")
	if ra, err := strconv.Atoi(w.Header().Get("Retry-After")); err != nil || ra < 1 || ra > 2 {
		t.Fatalf("Retry-After %q, want the 1-2 s until the oldest token expires", w.Header().Get("Retry-After"))
	}
	f.token(2) // another user is not affected
	time.Sleep(ttl + 100*time.Millisecond)
	for range maxTokens {
		f.token(1)
	}
}

func TestDefaults(t *testing.T) {
	m, err := New(singleNode(t), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.client.Close()
	if m.o.TTL != DefaultTTL || m.o.Lease != DefaultLease || m.o.MaxTokens != DefaultMaxTokens {
		t.Fatalf("defaults %+v", m.o)
	}
	if _, err := New(nil, Options{}); err == nil {
		t.Fatal("New without a client")
	}
}
