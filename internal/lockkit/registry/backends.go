package registry

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/etcdlock"
	"github.com/lockbench/shop/internal/lockkit/local"
	"github.com/lockbench/shop/internal/lockkit/memcachedlock"
	"github.com/lockbench/shop/internal/lockkit/mysqllock"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/lockkit/redlock"
	"github.com/lockbench/shop/internal/lockkit/zklock"
)

// Session lengths of the session-based backends: how long a crashed
// holder's lock outlives it. Short enough that a crash heals in seconds,
// long enough that a GC pause or a busy loopback does not end a session.
const (
	zkSessionTimeout = 6 * time.Second
	etcdSessionTTL   = 6 * time.Second
)

// backends is every backend: adding one is adding its entry here
// (docs/backends.md). Capabilities are taken from the backend's own
// declaration on a nil Locker of its type, which reads no field.
var backends = []Backend{
	{
		Name: "none", Capabilities: lockkit.CapabilitiesOf(lockkit.None()),
		open: func(context.Context, Settings, string) (lockkit.Locker, error) { return lockkit.None(), nil },
	},
	{
		Name: "local", Capabilities: lockkit.CapabilitiesOf((*local.Locker)(nil)),
		open: func(context.Context, Settings, string) (lockkit.Locker, error) { return local.New(), nil },
	},
	{
		Name:         "redis",
		Server:       Server{Kind: Redis, Setting: "SHOP_REDIS_ADDRS", TestEnv: "SHOP_TEST_REDIS_ADDR", Store: true},
		Capabilities: lockkit.CapabilitiesOf((*redislock.Locker)(nil)),
		open: func(_ context.Context, s Settings, _ string) (lockkit.Locker, error) {
			if s.Redis == nil {
				return nil, errors.New("lock backend redis needs shop's Redis client")
			}
			l, err := redislock.New(s.Redis)
			if err != nil {
				return nil, err
			}
			return l, nil
		},
	},
	{
		Name: "redlock", Needs: "SHOP_REDLOCK_ADDRS",
		Server:       Server{Kind: Redlock, Setting: "SHOP_REDLOCK_ADDRS", TestEnv: "SHOP_TEST_REDLOCK_ADDRS"},
		Capabilities: lockkit.CapabilitiesOf((*redlock.Locker)(nil)),
		open: func(_ context.Context, s Settings, _ string) (lockkit.Locker, error) {
			clients := make([]redis.UniversalClient, len(s.RedlockAddrs))
			var closers []func() error
			for i, addr := range s.RedlockAddrs {
				// One silent master must cost one attempt's timeout, not
				// go-redis's dial retries and its 3 s read timeout.
				c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1})
				clients[i] = c
				closers = append(closers, c.Close)
			}
			return withClosers(redlock.New(clients), closers...), nil
		},
	},
	{
		Name: "mysql", Needs: "SHOP_MYSQL_DSN",
		Server:       Server{Kind: MariaDB, Setting: "SHOP_MYSQL_DSN", TestEnv: "SHOP_TEST_MYSQL_DSN", Store: true},
		Capabilities: lockkit.CapabilitiesOf((*mysqllock.Locker)(nil)),
		open: func(_ context.Context, s Settings, _ string) (lockkit.Locker, error) {
			if err := needMySQL("mysql", s); err != nil {
				return nil, err
			}
			return mysqllock.New(s.DB)
		},
	},
	{
		Name: "mysql-forupdate", Needs: "SHOP_MYSQL_DSN",
		Server:       Server{Kind: MariaDB, Setting: "SHOP_MYSQL_DSN", TestEnv: "SHOP_TEST_MYSQL_DSN", Store: true},
		Capabilities: lockkit.CapabilitiesOf((*mysqllock.ForUpdateLocker)(nil)),
		open: func(_ context.Context, s Settings, _ string) (lockkit.Locker, error) {
			if err := needMySQL("mysql-forupdate", s); err != nil {
				return nil, err
			}
			return mysqllock.NewForUpdate(s.DB)
		},
	},
	{
		Name: "zookeeper", Needs: "SHOP_ZK_ADDRS",
		Server:       Server{Kind: ZooKeeper, Setting: "SHOP_ZK_ADDRS", TestEnv: "SHOP_TEST_ZK_ADDRS"},
		Capabilities: lockkit.CapabilitiesOf((*zklock.Locker)(nil)),
		Slack:        zkSessionTimeout,
		keys:         pathKeys,
		open: func(_ context.Context, s Settings, root string) (lockkit.Locker, error) {
			return zklock.New(s.ZKAddrs, zkSessionTimeout, zklock.WithRoot(root))
		},
	},
	{
		Name: "etcd", Needs: "SHOP_ETCD_ENDPOINTS",
		Server:       Server{Kind: Etcd, Setting: "SHOP_ETCD_ENDPOINTS", TestEnv: "SHOP_TEST_ETCD_ENDPOINTS"},
		Capabilities: lockkit.CapabilitiesOf((*etcdlock.Locker)(nil)),
		Slack:        etcdSessionTTL,
		keys:         pathKeys,
		open: func(_ context.Context, s Settings, root string) (lockkit.Locker, error) {
			return etcdlock.New(s.EtcdEndpoints, etcdlock.WithSessionTTL(etcdSessionTTL), etcdlock.WithPrefix(root))
		},
	},
	{
		Name: "memcached", Needs: "SHOP_MEMCACHED_ADDRS",
		Server:       Server{Kind: Memcached, Setting: "SHOP_MEMCACHED_ADDRS", TestEnv: "SHOP_TEST_MEMCACHED_ADDR"},
		Capabilities: lockkit.CapabilitiesOf((*memcachedlock.Locker)(nil)),
		// Expiries are whole seconds on the server's clock.
		Slack: 2 * time.Second,
		open: func(_ context.Context, s Settings, _ string) (lockkit.Locker, error) {
			return memcachedlock.New(memcache.New(s.MemcachedAddrs...)), nil
		},
	},
}

func needMySQL(name string, s Settings) error {
	if s.DB == nil || s.DB.Dialector.Name() != "mysql" {
		return fmt.Errorf("lock backend %s needs SHOP_MYSQL_DSN (the embedded SQLite cannot hold its locks)", name)
	}
	return nil
}

// closingLocker closes the clients a backend was built on with it.
type closingLocker struct {
	lockkit.Locker
	closers []func() error
}

func withClosers(l lockkit.Locker, closers ...func() error) lockkit.Locker {
	return closingLocker{l, closers}
}

func (c closingLocker) Close() error {
	errs := []error{c.Locker.Close()}
	for _, close := range c.closers {
		errs = append(errs, close())
	}
	return errors.Join(errs...)
}

// Capabilities passes the backend's declaration through the wrapper.
func (c closingLocker) Capabilities() lockkit.Capabilities {
	return lockkit.CapabilitiesOf(c.Locker)
}
