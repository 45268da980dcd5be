package like

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/guard"
	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/testenv"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func serverAddrs(t *testing.T, env string) []string { return testenv.RequireList(t, env) }

func clusterClient(t *testing.T) redis.UniversalClient {
	addrs := serverAddrs(t, "SHOP_TEST_REDIS_CLUSTER_ADDRS")
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

func nodeClient(t *testing.T) redis.UniversalClient {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")
	c := redis.NewClient(&redis.Options{Addr: addr[0], ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	return c
}

// testPrefix keeps this package's keys apart from other packages' tests and
// from its own earlier runs on the same servers.
func testPrefix(t *testing.T) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "like_test:" + hex.EncodeToString(b) + ":"
}

// newService builds a Service under o.Prefix (a fresh one if empty) and
// deletes its keys when the test ends.
func newService(t *testing.T, client redis.UniversalClient, o Options) *Service {
	t.Helper()
	if o.Prefix == "" {
		o.Prefix = testPrefix(t)
	}
	s, err := New(client, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.k.prefix = o.Prefix // fences too: the test's keys are all garbage now
		if err := s.clearAll(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return s
}

// clearAll deletes every key of the service, fences included.
func (s *Service) clearAll(ctx context.Context) error {
	if err := s.clear(ctx); err != nil {
		return err
	}
	del := func(ctx context.Context, node redis.UniversalClient) error {
		it := node.Scan(ctx, 0, globEscape(s.k.prefix)+"*", 500).Iterator()
		for it.Next(ctx) {
			if err := node.Unlink(ctx, it.Val()).Err(); err != nil {
				return err
			}
		}
		return it.Err()
	}
	if cluster, ok := s.client.(*redis.ClusterClient); ok {
		return cluster.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error { return del(ctx, n) })
	}
	return del(ctx, s.client)
}

func redisLocker(t *testing.T, client redis.UniversalClient) lockkit.Locker {
	l, err := redislock.New(client, redislock.WithPrefix(testPrefix(t)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// entities registers n posts of three owners.
func entities(t *testing.T, s *Service, n int) []Entity {
	t.Helper()
	es := posts(n, 3)
	for _, e := range es {
		if created, err := s.Register(context.Background(), e); err != nil || !created {
			t.Fatalf("register %v: created %v, %v", e, created, err)
		}
	}
	return es
}

// toggles runs 100 likes and unlikes by 20 users on 5 entities, released
// together on one closed channel. Each (user, entity) pair gets five
// operations at once (like, unlike, like, unlike, like), the collisions a
// double click or a retried request produce; with a lock the pair ends
// liked, without one each racing like counts again.
func toggles(t *testing.T, s *Service, es []Entity) {
	t.Helper()
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for g := range 100 {
		user, e, add := int64(g%20+1), es[g%5], (g/20)%2 == 0
		wg.Go(func() {
			<-start
			var err error
			if add {
				_, err = s.Like(context.Background(), user, e.Ref)
			} else {
				_, err = s.Unlike(context.Background(), user, e.Ref)
			}
			if err != nil {
				errs <- err
			}
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestClusterLockKeepsDriftZero(t *testing.T) {
	client := clusterClient(t)
	s := newService(t, client, Options{Locking: guard.Locking{Locker: redisLocker(t, client),
		CriticalSectionDelay: 5 * time.Millisecond}})
	es := entities(t, s, 5)
	toggles(t, s, es)

	drift, err := s.Drift(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(drift) != 0 {
		t.Fatalf("like drift with the redis lock on a cluster: %v, want none", drift)
	}
	// Every pair's last operation in any order is not fixed, but with the
	// lock each pair got all five applied one by one: the counters of all
	// owners must add up to the likes on all entities.
	var received, likes int64
	for owner := int64(1); owner <= 3; owner++ {
		n, err := s.Received(context.Background(), owner)
		if err != nil {
			t.Fatal(err)
		}
		received += n
	}
	for _, e := range es {
		st, err := s.Get(context.Background(), 1, e.Ref)
		if err != nil {
			t.Fatal(err)
		}
		likes += st.Likes
	}
	if received != likes || likes == 0 {
		t.Fatalf("received %d, likes %d: want equal and above 0", received, likes)
	}
}

func TestClusterNoLockDrifts(t *testing.T) {
	client := clusterClient(t)
	s := newService(t, client, Options{Locking: guard.Locking{Locker: lockkit.None(),
		CriticalSectionDelay: 20 * time.Millisecond}})
	toggles(t, s, entities(t, s, 5))

	drift, err := s.Drift(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(drift) == 0 {
		t.Fatal("no like drift without a lock: the race this package demonstrates did not happen")
	}
	t.Logf("like drift without a lock: %v", drift)
}

func TestClusterHashTagNeedsNoLock(t *testing.T) {
	client := clusterClient(t)
	s := newService(t, client, Options{Strategy: StrategyHashTag})
	es := entities(t, s, 5)
	toggles(t, s, es)

	drift, err := s.Drift(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(drift) != 0 {
		t.Fatalf("like drift with the hashtag script: %v, want none", drift)
	}
	// Each pair ran like, unlike, like, unlike, like in some order; the set
	// ends either way, but the counter always equals it.
	for owner := int64(1); owner <= 3; owner++ {
		if _, err := s.Received(context.Background(), owner); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSlots checks the premise of the package on the real cluster: the
// lock strategy's set and counter are in different slots, the hashtag
// strategy's in one.
func TestSlots(t *testing.T) {
	client := clusterClient(t)
	slot := func(key string) int64 {
		n, err := client.ClusterKeySlot(context.Background(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	e := Entity{Ref: Ref{Type: "post", ID: "7"}, Owner: 42}
	k := keys{prefix: "like:"}
	sp, tg := &spread{k: k}, &tagged{k: k}
	if slot(sp.likers(e)) == slot(sp.received(42)) {
		t.Errorf("lock strategy: %s and %s share a slot; pick a test entity that does not", sp.likers(e), sp.received(42))
	}
	if slot(sp.likers(e)) != slot(sp.fence(e)) {
		t.Errorf("lock strategy: the set and its fence must share a slot for the fenced write")
	}
	if a, b, c := slot(tg.likers(e)), slot(tg.received(42)), slot(tg.owned(42)); a != b || b != c {
		t.Errorf("hashtag strategy: slots %d, %d, %d; want one", a, b, c)
	}
}

func TestLikeTwiceUnlikeTwice(t *testing.T) {
	client := nodeClient(t)
	for _, strategy := range []string{StrategyLock, StrategyHashTag} {
		t.Run(strategy, func(t *testing.T) {
			s := newService(t, client, Options{Strategy: strategy, Locking: guard.Locking{Locker: redisLocker(t, client)}})
			ctx := context.Background()
			e := entities(t, s, 1)[0]
			want := func(st State, likes int64, liked bool, received int64) {
				t.Helper()
				if st.Likes != likes || st.Liked != liked || st.Owner != e.Owner {
					t.Fatalf("state %+v; want %d likes, liked %v, owner %d", st, likes, liked, e.Owner)
				}
				if n, err := s.Received(ctx, e.Owner); err != nil || n != received {
					t.Fatalf("received %d, %v; want %d", n, err, received)
				}
			}
			for range 2 {
				st, err := s.Like(ctx, 9, e.Ref)
				if err != nil {
					t.Fatal(err)
				}
				want(st, 1, true, 1)
			}
			st, err := s.Get(ctx, 10, e.Ref)
			if err != nil {
				t.Fatal(err)
			}
			want(st, 1, false, 1)
			for range 2 {
				st, err := s.Unlike(ctx, 9, e.Ref)
				if err != nil {
					t.Fatal(err)
				}
				want(st, 0, false, 0)
			}
			if d, err := s.Drift(ctx); err != nil || len(d) != 0 {
				t.Fatalf("drift %v, %v", d, err)
			}
		})
	}
}

func TestRegister(t *testing.T) {
	client := nodeClient(t)
	s := newService(t, client, Options{Locking: guard.Locking{Locker: lockkit.None()}})
	ctx := context.Background()
	e := Entity{Ref: Ref{Type: "post", ID: "a-1"}, Owner: 4}
	for i, want := range []bool{true, false} {
		created, err := s.Register(ctx, e)
		if err != nil || created != want {
			t.Fatalf("register #%d: created %v, %v; want %v", i+1, created, err, want)
		}
	}
	if _, err := s.Register(ctx, Entity{Ref: e.Ref, Owner: 5}); !errors.Is(err, ErrOwnerConflict) {
		t.Fatalf("another owner: %v, want ErrOwnerConflict", err)
	}
	for _, bad := range []Entity{
		{Ref: Ref{Type: "Post", ID: "1"}, Owner: 1},
		{Ref: Ref{Type: "post", ID: "{1}"}, Owner: 1},
		{Ref: Ref{Type: "post", ID: "a:b"}, Owner: 1},
		{Ref: Ref{Type: "post", ID: "1"}, Owner: 0},
	} {
		if _, err := s.Register(ctx, bad); !errors.Is(err, ErrInvalidEntity) {
			t.Errorf("register %+v: %v, want ErrInvalidEntity", bad, err)
		}
	}
	if _, err := s.Like(ctx, 1, Ref{Type: "post", ID: "nope"}); !errors.Is(err, ErrEntityNotFound) {
		t.Fatalf("like of an unregistered entity: %v, want ErrEntityNotFound", err)
	}
}

// TestStaleFenceRefused: the scripts' rules on their own. A check claims
// the set for its token unless a higher one has; a write lands only under
// the token the set carries.
func TestStaleFenceRefused(t *testing.T) {
	client := nodeClient(t)
	s := newService(t, client, Options{Locking: guard.Locking{Locker: lockkit.None()}})
	ctx := context.Background()
	e := entities(t, s, 1)[0]
	sp := s.strategy.(*spread)
	keys := []string{sp.likers(e), sp.fence(e)}
	check := func(user int64, fence uint64) int64 {
		n, err := checkScript.Run(ctx, client, keys, user, fence).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	write := func(user int64, fence uint64) int64 {
		n, err := writeScript.Run(ctx, client, keys, user, "add", fence).Int64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := check(1, 5); n != 0 {
		t.Fatalf("check under token 5: %d, want 0 (not a member)", n)
	}
	if n := write(1, 5); n != 1 {
		t.Fatalf("write under the claimed token 5: %d, want 1 (added)", n)
	}
	if n := check(1, 5); n != 1 {
		t.Fatalf("check again under token 5: %d, want 1 (a member)", n)
	}
	if n := check(2, 4); n != -1 {
		t.Fatalf("check under token 4 after 5: %d, want -1 (refused)", n)
	}
	for _, other := range []uint64{4, 6} {
		if n := write(2, other); n != -1 {
			t.Fatalf("write under token %d, not the set's 5: %d, want -1 (refused)", other, n)
		}
	}
	if n := write(2, 0); n != 1 {
		t.Fatalf("unfenced write: %d, want 1", n)
	}
}

func TestReset(t *testing.T) {
	client := nodeClient(t)
	s := newService(t, client, Options{Locking: guard.Locking{Locker: redisLocker(t, client)}})
	ctx := context.Background()
	e := entities(t, s, 1)[0]
	if _, err := s.Like(ctx, 3, e.Ref); err != nil {
		t.Fatal(err)
	}
	fence := s.strategy.(*spread).fence(e)
	before, err := client.Get(ctx, fence).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(ctx, "default"); err != nil {
		t.Fatal(err)
	}
	st, err := s.Get(ctx, 3, e.Ref)
	if err != nil || st.Likes != 0 || st.Liked {
		t.Fatalf("after reset: %+v, %v; want 0 likes", st, err)
	}
	if after, err := client.Get(ctx, fence).Int64(); err != nil || strconv.FormatInt(after-1, 10) != before {
		t.Fatalf("fence after reset: %d, %v; want %s raised by one", after, err, before)
	}
	for i := 1; i <= 5; i++ {
		if _, err := s.Get(ctx, 1, Ref{Type: "post", ID: strconv.Itoa(i)}); err != nil {
			t.Fatalf("fixture post %d: %v", i, err)
		}
	}
	if err := s.Reset(ctx, "nope"); err == nil {
		t.Fatal("reset to an unknown fixture succeeded")
	}
}

// BenchmarkLike compares one like+unlike pair under each strategy on the
// cluster: the lock strategy pays the lock's round trips on top of its
// three commands; the hashtag strategy is one script.
func BenchmarkLike(b *testing.B) {
	for _, strategy := range []string{StrategyLock, StrategyHashTag} {
		b.Run(strategy, func(b *testing.B) {
			addrs := os.Getenv("SHOP_TEST_REDIS_CLUSTER_ADDRS")
			if addrs == "" {
				b.Skip("SHOP_TEST_REDIS_CLUSTER_ADDRS not set")
			}
			client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(addrs, ","), ContextTimeoutEnabled: true})
			defer client.Close()
			locker, err := redislock.New(client, redislock.WithPrefix("like_bench:"))
			if err != nil {
				b.Fatal(err)
			}
			defer locker.Close()
			s, err := New(client, Options{Strategy: strategy, Locking: guard.Locking{Locker: locker}, Prefix: "like_bench:"})
			if err != nil {
				b.Fatal(err)
			}
			ctx := context.Background()
			defer s.clearAll(ctx)
			e := Entity{Ref: Ref{Type: "post", ID: "1"}, Owner: 1}
			if _, err := s.Register(ctx, e); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := s.Like(ctx, 1, e.Ref); err != nil {
					b.Fatal(err)
				}
				if _, err := s.Unlike(ctx, 1, e.Ref); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestResetRemovesExactlyItsKeys: entities whose ids are the suffixes of
// other keys (fence, likers) are forgotten by a reset like any other,
// under both strategies, with prefixes holding glob characters; a service
// whose prefix those characters would match keeps its likes; only the
// lock strategy's fence keys stay, matched by their full form.
func TestResetRemovesExactlyItsKeys(t *testing.T) {
	client := nodeClient(t)
	ctx := context.Background()
	for _, strategy := range []string{StrategyLock, StrategyHashTag} {
		for _, glob := range []struct{ own, neighbour string }{
			{own: "*", neighbour: "zz"},  // base*like:* would match basezzlike:…
			{own: "[x]", neighbour: "x"}, // base[x]like:* would match basexlike:…
		} {
			t.Run(strategy+"/"+glob.own, func(t *testing.T) {
				base := testPrefix(t)
				o := Options{Strategy: strategy, Locking: guard.Locking{Locker: redisLocker(t, client)}}
				o.Prefix = base + glob.own
				s := newService(t, client, o)
				o.Prefix = base + glob.neighbour
				neighbour := newService(t, client, o)
				odd := []Ref{{Type: "post", ID: "fence"}, {Type: "post", ID: "likers"}}
				for _, svc := range []*Service{s, neighbour} {
					for _, r := range odd {
						if _, err := svc.Register(ctx, Entity{Ref: r, Owner: 1}); err != nil {
							t.Fatal(err)
						}
						if _, err := svc.Like(ctx, 2, r); err != nil {
							t.Fatal(err)
						}
					}
				}
				if err := s.Reset(ctx, "default"); err != nil {
					t.Fatal(err)
				}
				for _, r := range odd {
					if _, err := s.Get(ctx, 2, r); !errors.Is(err, ErrEntityNotFound) {
						t.Errorf("%s after the reset: %v, want ErrEntityNotFound", r, err)
					}
					if st, err := neighbour.Get(ctx, 2, r); err != nil || st.Likes != 1 || !st.Liked {
						t.Errorf("the neighbour's %s after the reset: %+v, %v; want its one like", r, st, err)
					}
				}
				keys, err := client.Keys(ctx, globEscape(s.k.prefix)+"*").Result()
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range keys {
					if strings.Contains(k, "post:fence") || strings.Contains(k, "post:likers") {
						if !s.k.isFence(k) {
							t.Errorf("key %q survived the reset", k)
						}
					}
				}
				if drift, err := s.Drift(ctx); err != nil || len(drift) != 0 {
					t.Errorf("drift %v, %v; want none", drift, err)
				}
			})
		}
	}
}

// TestALikeWhoseCounterReplyIsLostCountsOnce: the owner's counter moves,
// then the connection drops before its reply arrives (a failover, a cut
// link). The client sends the command again on a new connection; the like
// must still count once, under both strategies.
func TestALikeWhoseCounterReplyIsLostCountsOnce(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	for _, strategy := range []string{StrategyLock, StrategyHashTag} {
		t.Run(strategy, func(t *testing.T) {
			ctx := context.Background()
			direct := nodeClient(t)
			o := Options{Strategy: strategy, Locking: guard.Locking{Locker: lockkit.None()}, Prefix: testPrefix(t)}
			s := newService(t, direct, o)
			e := Entity{Ref: Ref{Type: "post", ID: "1"}, Owner: 7}
			if _, err := s.Register(ctx, e); err != nil {
				t.Fatal(err)
			}
			// Loaded beforehand, so that the lost reply is the command's,
			// not a NOSCRIPT that go-redis answers with EVAL.
			for _, sc := range []*redis.Script{checkScript, writeScript, toggleScript, countScript} {
				if err := sc.Load(ctx, direct).Err(); err != nil {
					t.Fatal(err)
				}
			}
			cutter, via := testenv.NewReplyCutter(t, addr, []byte(s.strategy.received(e.Owner)))
			proxied := redis.NewClient(&redis.Options{Addr: via, ContextTimeoutEnabled: true})
			t.Cleanup(func() { proxied.Close() })
			ps, err := New(proxied, o)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := ps.Like(ctx, 2, e.Ref); err != nil {
				t.Logf("like with its reply lost: %v (an unknown outcome)", err)
			}
			if !cutter.Cut() {
				t.Fatal("no reply was lost: the test proves nothing")
			}
			if n, err := s.Received(ctx, e.Owner); err != nil || n != 1 {
				t.Errorf("owner's count %d (%v), want 1: one like", n, err)
			}
			if drift, err := s.Drift(ctx); err != nil || len(drift) != 0 {
				t.Errorf("drift %v (%v), want none", drift, err)
			}
		})
	}
}

// TestALikeWhoseCounterNeverAnswersIsAnUnknownOutcome: every reply of the
// counter's command is lost, resends included. The set has changed and
// the counter may have: the like must answer an unknown outcome, not
// "nothing was changed", and the counter must have moved once however
// often it was sent.
func TestALikeWhoseCounterNeverAnswersIsAnUnknownOutcome(t *testing.T) {
	addr := serverAddrs(t, "SHOP_TEST_REDIS_ADDR")[0]
	ctx := context.Background()
	direct := nodeClient(t)
	o := Options{Locking: guard.Locking{Locker: lockkit.None()}, Prefix: testPrefix(t)}
	s := newService(t, direct, o)
	e := Entity{Ref: Ref{Type: "post", ID: "1"}, Owner: 7}
	if _, err := s.Register(ctx, e); err != nil {
		t.Fatal(err)
	}
	for _, sc := range []*redis.Script{checkScript, writeScript, countScript} {
		if err := sc.Load(ctx, direct).Err(); err != nil {
			t.Fatal(err)
		}
	}
	cutter, via := testenv.NewReplyCutter(t, addr, []byte(s.strategy.received(e.Owner)))
	cutter.CutEvery()
	proxied := redis.NewClient(&redis.Options{Addr: via, ContextTimeoutEnabled: true})
	t.Cleanup(func() { proxied.Close() })
	ps, err := New(proxied, o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ps.Like(ctx, 2, e.Ref); !errors.Is(err, ErrOutcomeUnknown) {
		t.Errorf("like whose count never answered: %v, want ErrOutcomeUnknown", err)
	}
	if n, err := s.Received(ctx, e.Owner); err != nil || n != 1 {
		t.Errorf("owner's count %d (%v), want 1: one like, however often sent", n, err)
	}
	if drift, err := s.Drift(ctx); err != nil || len(drift) != 0 {
		t.Errorf("drift %v (%v), want none", drift, err)
	}
}
