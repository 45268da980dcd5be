package registry_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/bradfitz/gomemcache/memcache"
	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
	"github.com/lockbench/shop/internal/lockkit/registry"
	"github.com/lockbench/shop/internal/shoptest"
	"github.com/lockbench/shop/internal/testenv"
)

const prefix = "shop-a:"

// stored is what one backend writes on its server for a held key.
type stored struct {
	settings registry.Settings
	// keys lists the server's keys (or paths, rows) after key is held.
	keys func(t *testing.T, key string) []string
}

// server gives backend b a server: miniredis for the Redis ones, the
// testenv servers for the others (skipped without them, failed in CI).
func server(t *testing.T, b registry.Backend) stored {
	t.Helper()
	serve, ok := servers[b.Server.Kind]
	if !ok {
		t.Fatalf("no test server for kind %q: add it here", b.Server.Kind)
	}
	return serve(t, b)
}

// servers starts, per server kind, a server for one backend of that kind.
var servers = map[string]func(t *testing.T, b registry.Backend) stored{
	"":                 noServer,
	registry.Redis:     redisServer,
	registry.Redlock:   redlockServers,
	registry.MariaDB:   mariaDBServer,
	registry.ZooKeeper: zooKeeperServer,
	registry.Etcd:      etcdServer,
	registry.Memcached: memcachedServer,
}

// noServer is for the in-process backends, which store nothing outside.
func noServer(*testing.T, registry.Backend) stored {
	return stored{keys: func(*testing.T, string) []string { return nil }}
}

func redisServer(t *testing.T, _ registry.Backend) stored {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return stored{settings: registry.Settings{Redis: c}, keys: func(*testing.T, string) []string { return m.Keys() }}
}

func redlockServers(t *testing.T, _ registry.Backend) stored {
	var addrs []string
	var ms []*miniredis.Miniredis
	for range 3 {
		m := miniredis.RunT(t)
		ms = append(ms, m)
		addrs = append(addrs, m.Addr())
	}
	return stored{settings: registry.Settings{RedlockAddrs: addrs}, keys: func(t *testing.T, _ string) []string {
		var all []string
		for _, m := range ms {
			all = append(all, m.Keys()...)
		}
		return all
	}}
}

func mariaDBServer(t *testing.T, b registry.Backend) stored {
	db, err := gorm.Open(gormmysql.Open(shoptest.MySQL(t)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, _ := db.DB()
	t.Cleanup(func() { _ = sqlDB.Close() })
	table := map[string]string{"mysql": "locks", "mysql-forupdate": "row_locks"}[b.Name]
	return stored{settings: registry.Settings{DB: db}, keys: func(t *testing.T, _ string) []string {
		var names []string
		if err := db.Raw("SELECT CAST(name AS CHAR) FROM " + table).Scan(&names).Error; err != nil {
			t.Fatal(err)
		}
		return names
	}}
}

func zooKeeperServer(t *testing.T, b registry.Backend) stored {
	addrs := testenv.RequireList(t, b.Server.TestEnv)
	conn, _, err := zk.Connect(addrs, 5*time.Second, zk.WithLogInfo(false))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	return stored{settings: registry.Settings{ZKAddrs: addrs}, keys: func(t *testing.T, key string) []string {
		// The node directory of zklock.WithRoot("/shop/locks/" + prefix).
		dir := "/shop/locks/" + prefix + "/" + key
		kids, _, err := conn.Children(dir)
		if err != nil {
			t.Fatalf("children of %s: %v", dir, err)
		}
		if len(kids) == 0 {
			return nil
		}
		return []string{dir}
	}}
}

func etcdServer(t *testing.T, b registry.Backend) stored {
	eps := testenv.RequireList(t, b.Server.TestEnv)
	c, err := clientv3.New(clientv3.Config{Endpoints: eps, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return stored{settings: registry.Settings{EtcdEndpoints: eps}, keys: func(t *testing.T, key string) []string {
		// The keys of etcdlock.WithPrefix("/shop/locks/" + prefix).
		dir := "/shop/locks/" + prefix + key + "/"
		res, err := c.Get(context.Background(), dir, clientv3.WithPrefix(), clientv3.WithKeysOnly())
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Kvs) == 0 {
			return nil
		}
		return []string{dir}
	}}
}

func memcachedServer(t *testing.T, b registry.Backend) stored {
	addr := testenv.Require(t, b.Server.TestEnv)
	c := memcache.New(addr)
	return stored{settings: registry.Settings{MemcachedAddrs: []string{addr}}, keys: func(t *testing.T, key string) []string {
		if _, err := c.Get(prefix + key); err != nil {
			return nil
		}
		return []string{prefix + key}
	}}
}

// TestOpenEveryBackend opens every registered backend with a prefix, holds
// a key, and checks two things: what it declares in the registry is what
// the opened Locker declares, and the key it stores on its server is the
// one the backend itself makes of the prefix and the key (a key that
// changed between releases would start its fence counter over, and fenced
// stores would refuse every write). mysql stores prefix+key.
func TestOpenEveryBackend(t *testing.T) {
	want := map[string]func(key string) []string{
		"none":  func(string) []string { return nil },
		"local": func(string) []string { return nil },
		// redislock.WithPrefix(prefix), as cmd/shop opened it before.
		"redis": func(key string) []string { return redisKeys(t, key, redislock.WithPrefix(prefix)) },
		// lockkit.WithKeyPrefix(redlock.New(…), prefix) before: the same
		// key on each of the three masters.
		"redlock":         func(key string) []string { return []string{prefix + key, prefix + key, prefix + key} },
		"mysql":           func(key string) []string { return []string{prefix + key} },
		"mysql-forupdate": func(key string) []string { return []string{prefix + key} },
		"zookeeper":       func(key string) []string { return []string{"/shop/locks/" + prefix + "/" + key} },
		"etcd":            func(key string) []string { return []string{"/shop/locks/" + prefix + key + "/"} },
		"memcached":       func(key string) []string { return []string{prefix + key} },
	}
	for _, b := range registry.Backends() {
		t.Run(b.Name, func(t *testing.T) {
			expect, ok := want[b.Name]
			if !ok {
				t.Fatalf("backend %s: add the key it stores to this test", b.Name)
			}
			srv := server(t, b)
			s := srv.settings
			s.KeyPrefix = prefix
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			l, err := registry.Open(ctx, b.Name, s)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			if got := lockkit.CapabilitiesOf(l); got != b.Capabilities {
				t.Errorf("opened Locker declares %+v, the registry %+v", got, b.Capabilities)
			}
			key := "lock:stock:" + shoptest.Random(4)
			lease, err := l.Acquire(ctx, key, lockkit.WithTTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			defer lease.Release(context.Background())
			if lease.Key() != key {
				t.Errorf("lease key %q, want the caller's %q", lease.Key(), key)
			}
			got := srv.keys(t, key)
			wantKeys := expect(key)
			slices.Sort(got)
			slices.Sort(wantKeys)
			if !slices.Equal(got, wantKeys) {
				t.Errorf("server holds %q, want %q", got, wantKeys)
			}
		})
	}
}

// redisKeys are the keys redislock, opened with opts, writes while it holds
// key: what the registry's redis backend must write too.
func redisKeys(t *testing.T, key string, opts ...redislock.Option) []string {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	l, err := redislock.New(c, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	lease, err := l.Acquire(context.Background(), key, lockkit.WithTTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release(context.Background())
	return m.Keys()
}

// The prefix without which nothing is namespaced leaves every backend as
// it opens bare: the keys of a shop without SHOP_KEY_PREFIX are unchanged,
// mysql's included.
func TestEmptyPrefixOpensBare(t *testing.T) {
	m := miniredis.RunT(t)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), ContextTimeoutEnabled: true})
	defer c.Close()
	l, err := registry.Open(context.Background(), "redis", registry.Settings{Redis: c})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if _, ok := l.(*redislock.Locker); !ok {
		t.Errorf("redis without a prefix opens as %T, want *redislock.Locker", l)
	}
}

func TestNamesAreUniqueAndServersComplete(t *testing.T) {
	seen := map[string]bool{}
	for _, b := range registry.Backends() {
		if seen[b.Name] {
			t.Errorf("backend %s registered twice", b.Name)
		}
		seen[b.Name] = true
		if b.Name != strings.ToLower(b.Name) || strings.ContainsAny(b.Name, " ,+") {
			t.Errorf("backend %q: names are lower case, without spaces, commas or '+' (the runner's row syntax)", b.Name)
		}
		srv := b.Server
		if (srv.Kind == "") != (srv.Setting == "") || (srv.Kind == "") != (srv.TestEnv == "") {
			t.Errorf("backend %s: server %+v is half declared", b.Name, srv)
		}
		if b.Needs != "" && b.Needs != srv.Setting {
			t.Errorf("backend %s needs %s but its server is set by %s", b.Name, b.Needs, srv.Setting)
		}
		if b.Capabilities.CrossProcess && srv.Kind == "" {
			t.Errorf("backend %s excludes across processes without a server", b.Name)
		}
	}
	if _, err := registry.Open(context.Background(), "nope", registry.Settings{}); err == nil {
		t.Error("Open of an unknown backend succeeded")
	}
}
