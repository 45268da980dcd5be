package locktest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/lockbench/shop/internal/lockkit"
)

// Run runs the whole conformance suite against h. Call it from a top-level
// test function: the cross-process tests re-run that function in helper
// processes, where Run does the helper's part and exits.
func Run(t *testing.T, h Harness) {
	if role := os.Getenv(envRole); role != "" {
		runHelper(t, h, role)
		return
	}
	if h.TTL <= 0 {
		h.TTL = 300 * time.Millisecond
	}
	caps := h.capabilities(t)
	t.Logf("declared: %+v", caps)
	// Servers' client libraries start goroutines of their own when the
	// suite opens Lockers; only those still running after every Close are
	// leaks.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())

	s := &suite{h: h, caps: caps, prefix: "locktest:" + randomHex(4) + ":"}
	t.Run("MutualExclusion32Goroutines", s.mutualExclusion)
	t.Run("MutualExclusion3Processes", s.crossProcess)
	t.Run("ExpiryAfterHolderDies", s.expiryAfterCrash)
	t.Run("OwnerCheckedRelease", s.ownerCheckedRelease)
	t.Run("ReleaseCanBeRetried", s.releaseRetried)
	t.Run("Extend", s.extend)
	t.Run("ExtendAfterTakeover", s.extendAfterTakeover)
	t.Run("ExtendRacingWatchdog", s.extendRacingWatchdog)
	t.Run("WatchdogOutlives3TTLs", s.watchdog)
	t.Run("LostWhenDeletedBehindHoldersBack", s.lostSignal)
	t.Run("FencesStrictlyIncrease", s.fences)
	t.Run("CancelWhileWaiting", s.cancelWhileWaiting)
	t.Run("CancelWhileWaitingOnSilentServer", s.cancelOnSilentServer)
	t.Run("ReleaseWhileRenewalHangs", s.releaseWhileRenewalHangs)
	t.Run("CloseRacingAcquireLeaksNothing", s.closeRacingAcquire)
	t.Run("WaitWithoutPolling", s.waitWithoutPolling)
	t.Run("WaitTimeout", s.waitTimeout)
	t.Run("TryAcquireOnHeldKey", s.tryAcquireHeld)
	t.Run("Reentrancy", s.reentrancy)
	t.Run("FairOrder", s.fairOrder)
	t.Run("HandOffLatency", s.handOff)
}

func (h Harness) capabilities(t testing.TB) lockkit.Capabilities {
	if h.Caps != nil {
		return *h.Caps
	}
	l := h.New(t)
	defer l.Close()
	d, ok := l.(lockkit.Describer)
	if !ok {
		t.Fatalf("%T declares no Capabilities: implement lockkit.Describer or set Harness.Caps", l)
	}
	return d.Capabilities()
}

type suite struct {
	h      Harness
	caps   lockkit.Capabilities
	prefix string
}

func (s *suite) key(t testing.TB) string { return s.prefix + t.Name() }

func (s *suite) open(t testing.TB) lockkit.Locker {
	l := s.h.New(t)
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// crashBound is how long a dead holder's grant may outlive it, generously:
// these are correctness bounds, not speed claims.
func (s *suite) crashBound() time.Duration { return 2*s.h.TTL + s.h.CrashSlack + 5*time.Second }

type ctxOption struct{ ctx context.Context }

// withCtx lets mustAcquire take a context among its options.
func withCtx(ctx context.Context) any { return ctxOption{ctx} }

func mustAcquire(t testing.TB, l lockkit.Locker, key string, opts ...any) lockkit.Lease {
	t.Helper()
	ctx, lopts := splitOpts(opts)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	lease, err := l.Acquire(ctx, key, lopts...)
	if err != nil {
		t.Fatalf("Acquire %s: %v", key, err)
	}
	return lease
}

func mustTry(t testing.TB, l lockkit.Locker, key string, opts ...any) lockkit.Lease {
	t.Helper()
	ctx, lopts := splitOpts(opts)
	lease, err := l.TryAcquire(ctx, key, lopts...)
	if err != nil {
		t.Fatalf("TryAcquire %s: %v", key, err)
	}
	return lease
}

func splitOpts(opts []any) (context.Context, []lockkit.Option) {
	ctx := context.Background()
	var lopts []lockkit.Option
	for _, o := range opts {
		switch o := o.(type) {
		case ctxOption:
			ctx = o.ctx
		case lockkit.Option:
			lopts = append(lopts, o)
		}
	}
	return ctx, lopts
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
