package lockbench

import (
	"testing"

	"github.com/lockbench/shop/internal/lockkit/registry"
)

// Every registered backend with a server must be measured against it; the
// in-process ones (none, local) have no server round trip to compare with.
func TestBenchmarksCoverEveryBackend(t *testing.T) {
	measured := map[string]bool{}
	for _, g := range groups() {
		for _, s := range g.subjects {
			if s.backend == "" {
				continue
			}
			if _, ok := registry.Lookup(s.backend); !ok {
				t.Errorf("subject %s measures backend %q, which is not registered", s.name, s.backend)
			}
			measured[s.backend] = true
		}
	}
	for _, b := range registry.Backends() {
		if b.Server.Kind != "" && !measured[b.Name] {
			t.Errorf("backend %s has no benchmark subject", b.Name)
		}
	}
}
