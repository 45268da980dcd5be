// Package registry is the one place a lock backend is named, as
// database/sql's Register is for drivers: its SHOP_LOCK_BACKEND name, the
// setting it needs, the server its locks live on, what it promises and how
// it opens. internal/config validates SHOP_LOCK_BACKEND against it,
// cmd/shop opens through it, and the load-test runner, the fault suite and
// the benchmarks take their backend lists from it, with a test in each that
// fails when one is missing. docs/backends.md is the checklist for adding a
// backend.
package registry

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"github.com/lockbench/shop/internal/lockkit"
)

// Backend is one lock backend.
type Backend struct {
	// Name is what SHOP_LOCK_BACKEND says.
	Name string
	// Needs is the SHOP_* variable config refuses the backend without, or
	// "" when it needs none (redis falls back on the embedded server).
	Needs string
	// Server is where the backend's locks live; zero for the in-process
	// backends.
	Server Server
	// Capabilities are what the backend declares (lockkit.CapabilitiesOf
	// of the Locker Open returns).
	Capabilities lockkit.Capabilities
	// Slack is how long a dead holder's grant may outlive its lease: the
	// session timeout Open gives the session-based backends, memcached's
	// whole-second clock.
	Slack time.Duration

	// keys is how SHOP_KEY_PREFIX reaches the server (Open applies it).
	keys keyShape
	// open returns the backend with no prefix of its own; root is the
	// path its keys live under, for backends whose keys are paths.
	open func(ctx context.Context, s Settings, root string) (lockkit.Locker, error)
}

// Server is the server a backend's locks live on, as shop and its tests
// find it.
type Server struct {
	// Kind is the server program, as scripts/testenv.sh and the fault
	// suite's private servers name it.
	Kind string
	// Setting is the SHOP_* variable that points shop at the server.
	Setting string
	// TestEnv is the SHOP_TEST_* variable scripts/testenv.sh exports with
	// the server's address (a comma-separated list for several).
	TestEnv string
	// Store marks one of shop's own stores (its Redis, its SQL database):
	// every shop process is pointed at it whatever the lock backend, and
	// each test harness sets it up its own way (a private database, the
	// Redis Cluster).
	Store bool
}

// Server kinds.
const (
	Redis     = "redis"
	Redlock   = "redlock" // three independent Redis masters
	MariaDB   = "mariadb"
	ZooKeeper = "zookeeper"
	Etcd      = "etcd"
	Memcached = "memcached"
)

// Settings are what a backend is opened with: the addresses of config and
// the clients cmd/shop opened for its own stores.
type Settings struct {
	// KeyPrefix is SHOP_KEY_PREFIX: every key a backend writes on its
	// server starts with it (Open applies it, the same way for all).
	KeyPrefix string
	// Redis is the client backend redis locks on: the lock Redis
	// (SHOP_LOCK_REDIS_ADDRS) when shop has one, else its main Redis.
	Redis redis.UniversalClient
	// DB is shop's SQL database; the mysql backends refuse SQLite.
	DB             *gorm.DB
	RedlockAddrs   []string
	ZKAddrs        []string
	EtcdEndpoints  []string
	MemcachedAddrs []string
}

// keyShape is how a prefix reaches a backend's server. The zero shape is
// flat keys: the server stores the key string, and lockkit.WithKeyPrefix
// puts the prefix in front of it.
type keyShape int

// pathKeys: the backend escapes each key into one path segment under a
// root, so a prefixed key would be a different path ('/' escaped); the
// prefix extends the root instead: root = PathRoot + prefix.
const pathKeys keyShape = 1

// PathRoot is the root of the backends whose keys are paths (ZooKeeper,
// etcd); the key prefix extends it.
const PathRoot = "/shop/locks/"

// Backends returns every backend, in the order of SHOP_LOCK_BACKEND's
// documentation.
func Backends() []Backend { return slices.Clone(backends) }

// Names returns the name of every backend.
func Names() []string {
	names := make([]string, len(backends))
	for i, b := range backends {
		names[i] = b.Name
	}
	return names
}

// Lookup returns the backend called name.
func Lookup(name string) (Backend, bool) {
	i := slices.IndexFunc(backends, func(b Backend) bool { return b.Name == name })
	if i < 0 {
		return Backend{}, false
	}
	return backends[i], true
}

// Open opens the backend called name, every key it writes on its server
// starting with s.KeyPrefix. The caller closes it; Close also closes the
// clients Open opened for it (not s.Redis nor s.DB).
func Open(ctx context.Context, name string, s Settings) (lockkit.Locker, error) {
	b, ok := Lookup(name)
	if !ok {
		return nil, fmt.Errorf("unknown lock backend %q", name)
	}
	if b.keys == pathKeys {
		return b.open(ctx, s, PathRoot+s.KeyPrefix)
	}
	l, err := b.open(ctx, s, "")
	if err != nil {
		return nil, err
	}
	return lockkit.WithKeyPrefix(l, s.KeyPrefix), nil
}

// CrossProcess returns the backends whose exclusion holds between
// processes: those a multi-process test or load test can exercise.
func CrossProcess() []Backend {
	var out []Backend
	for _, b := range backends {
		if b.Capabilities.CrossProcess {
			out = append(out, b)
		}
	}
	return out
}
