package deploytest

import (
	"slices"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/config"
)

// composeStopGrace is how long `docker compose stop` waits after SIGTERM
// before it sends SIGKILL, when a service sets no stop_grace_period.
const composeStopGrace = 10 * time.Second

// TestComposeStopGraceCoversShutdown: after SIGTERM a shop instance fails
// /readyz for SHOP_DRAIN_DELAY, then gives in-flight requests
// SHOP_SHUTDOWN_TIMEOUT, then cancels the rest and waits for them before it
// closes its stores. A SIGKILL before that cuts requests mid-flight and
// skips the orderly close the sequence exists for.
func TestComposeStopGraceCoversShutdown(t *testing.T) {
	p := loadCompose(t, nil)
	for _, s := range shopServices(p) {
		if slices.Contains(oneShot, s.Name) {
			continue
		}
		env := envOf(s)
		cfg, err := config.Load(func(name string) string { return env[name] })
		if err != nil {
			t.Fatalf("%s: %v", s.Name, err)
		}
		grace := composeStopGrace
		if s.StopGracePeriod != nil {
			grace = time.Duration(*s.StopGracePeriod)
		}
		if need := cfg.DrainDelay + cfg.ShutdownTimeout; grace <= need {
			t.Errorf("%s: stop_grace_period is %s, but the drain delay (%s) and the shutdown timeout (%s) alone take %s, and cancelled handlers then get a grace of their own",
				s.Name, grace, cfg.DrainDelay, cfg.ShutdownTimeout, need)
		}
	}
}
