// Package locktest is the conformance suite every lockkit backend passes.
//
// A backend's test builds a Harness and calls Run:
//
//	func TestConformance(t *testing.T) {
//		locktest.Run(t, locktest.Harness{
//			New:   func(t testing.TB) lockkit.Locker { return mybackend.New(...) },
//			Steal: func(t testing.TB, key string) { /* delete the key in the store */ },
//			Wired: func(t testing.TB, w *locktest.Wire) lockkit.Locker { return mybackend.New(w.Proxy(addr)) },
//			TTL:   300 * time.Millisecond,
//		})
//	}
//
// Run proves each property the backend declares in its Capabilities and
// shows that each property it does not declare is really absent, so that
// the backends table is filled from evidence. The cross-process tests re-run
// the test binary: Run must be called from a top-level test function.
package locktest

import (
	"testing"
	"time"

	"github.com/lockbench/shop/internal/lockkit"
)

// Harness is what the suite needs to know about a backend.
type Harness struct {
	// New opens a new client of the backend, as another process would. The
	// suite closes it. It is also called in the helper processes.
	New func(t testing.TB) lockkit.Locker
	// Steal deletes key's grant in the store behind its holder's back, as an
	// operator or a server-side expiry would. Required when the backend
	// declares LostSignal.
	Steal func(t testing.TB, key string)
	// TTL is the short lease the suite uses (a few hundred ms). Backends
	// with a coarser clock (memcached counts whole seconds) set more.
	TTL time.Duration
	// CrashSlack is how long after TTL a dead holder's grant may linger,
	// e.g. ZooKeeper's session timeout.
	CrashSlack time.Duration
	// Wired opens a client like New, but with every connection to its
	// servers passing through w: w.DialContext as the client's dialer, or
	// w.Proxy(addr) in place of each server address. The suite counts the
	// calls a waiting client makes with it and silences the server with
	// it. An in-process backend has no wire: it counts its store
	// operations with w.CountCall, and silencing changes nothing for it.
	Wired func(t testing.TB, w *Wire) lockkit.Locker
	// Caps overrides the Capabilities the Locker declares (for a Locker
	// that does not implement lockkit.Describer).
	Caps *lockkit.Capabilities
}
