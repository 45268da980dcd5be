package lockbench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bradfitz/gomemcache/memcache"
	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/go-zookeeper/zk"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/etcdlock"
	"github.com/lockbench/shop/internal/lockkit/memcachedlock"
	"github.com/lockbench/shop/internal/lockkit/mysqllock"
	"github.com/lockbench/shop/internal/lockkit/redlock"
	"github.com/lockbench/shop/internal/lockkit/zklock"
)

func init() {
	extraGroups = []func() group{redisClusterGroup, redlockGroup, zookeeperGroup, zookeeperEnsembleGroup, etcdGroup, etcdClusterGroup,
		mysqlGroup, memcachedGroup}
}

var long = lockkit.WithTTL(10 * time.Second)

func closeWith(b *testing.B, l lockkit.Locker, err error) lockkit.Locker {
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = l.Close() })
	return l
}

func redlockGroup() group {
	addrs := strings.Split(os.Getenv("SHOP_TEST_REDLOCK_ADDRS"), ",")
	clients := func(b *testing.B) []redis.UniversalClient {
		var cs []redis.UniversalClient
		for _, a := range addrs {
			c := redis.NewClient(&redis.Options{Addr: a, PoolSize: 64})
			b.Cleanup(func() { _ = c.Close() })
			cs = append(cs, c)
		}
		return cs
	}
	return group{
		name: "redlock-3-masters",
		env:  "SHOP_TEST_REDLOCK_ADDRS",
		roundTrip: func(b *testing.B) func(context.Context) error {
			c := clients(b)[0]
			return func(ctx context.Context) error { return c.Ping(ctx).Err() }
		},
		subjects: []subject{
			{name: "shop-redlock", backend: "redlock", open: shared(func(b *testing.B) Acquirer {
				return lockkitAcquirer(closeWith(b, redlock.New(clients(b)), nil), long)
			})},
			{name: "redsync", open: shared(func(b *testing.B) Acquirer {
				var pools []redsyncredis.Pool
				for _, c := range clients(b) {
					pools = append(pools, goredis.NewPool(c))
				}
				rs := redsync.New(pools...)
				return func(ctx context.Context, key string) (func() error, error) {
					m := rs.NewMutex("bench:redsync:"+key, redsync.WithExpiry(10*time.Second))
					if err := m.LockContext(ctx); err != nil {
						return nil, err
					}
					return func() error { _, err := m.Unlock(); return err }, nil
				}
			})},
		},
	}
}

func zookeeperGroup() group {
	addrs := strings.Split(os.Getenv("SHOP_TEST_ZK_ADDRS"), ",")
	conn := func(b *testing.B) *zk.Conn {
		c, _, err := zk.Connect(addrs, 10*time.Second, zk.WithLogInfo(false))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(c.Close)
		return c
	}
	return group{
		name: "zookeeper",
		env:  "SHOP_TEST_ZK_ADDRS",
		roundTrip: func(b *testing.B) func(context.Context) error {
			c := conn(b)
			return func(context.Context) error { _, _, err := c.Exists("/"); return err }
		},
		writeRoundTrip: func(b *testing.B) func(context.Context) error { return zkWrite(b, conn(b)) },
		subjects: []subject{
			{name: "shop-zookeeper", backend: "zookeeper", open: shared(func(b *testing.B) Acquirer {
				l, err := zklock.New(addrs, 10*time.Second, zklock.WithRoot("/bench/shop"))
				return lockkitAcquirer(closeWith(b, l, err), long)
			})},
			{name: "go-zookeeper-zk.Lock", open: shared(func(b *testing.B) Acquirer {
				c := conn(b)
				return func(_ context.Context, key string) (func() error, error) {
					lock := zk.NewLock(c, "/bench/peer/"+key, zk.WorldACL(zk.PermAll))
					if err := lock.Lock(); err != nil {
						return nil, err
					}
					return lock.Unlock, nil
				}
			})},
		},
	}
}

func etcdGroup() group {
	endpoints := strings.Split(os.Getenv("SHOP_TEST_ETCD_ENDPOINTS"), ",")
	client := func(b *testing.B) *clientv3.Client {
		c, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = c.Close() })
		return c
	}
	shop := func(b *testing.B) Acquirer {
		l, err := etcdlock.FromClient(client(b), etcdlock.WithPrefix("/bench/shop/"))
		return lockkitAcquirer(closeWith(b, l, err), long)
	}
	return group{
		name: "etcd",
		env:  "SHOP_TEST_ETCD_ENDPOINTS",
		roundTrip: func(b *testing.B) func(context.Context) error {
			c := client(b)
			return func(ctx context.Context) error { _, err := c.Get(ctx, "/bench/ping"); return err }
		},
		writeRoundTrip: func(b *testing.B) func(context.Context) error { return etcdWrite(client(b)) },
		subjects: []subject{
			{name: "shop-etcd", backend: "etcd", open: shared(shop)},
			// concurrency.Mutex keys its waiters by session lease, so
			// waiters sharing a session would share one grant: each waiter
			// gets a session of its own on its process's client, as the
			// docs require.
			{name: "etcd-concurrency.Mutex", open: func(b *testing.B) newWaiter {
				c := client(b)
				return func(b *testing.B) Acquirer {
					s, err := concurrency.NewSession(c, concurrency.WithTTL(10))
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(func() { _ = s.Close() })
					return func(ctx context.Context, key string) (func() error, error) {
						m := concurrency.NewMutex(s, "/bench/peer/"+key)
						if err := m.Lock(ctx); err != nil {
							return nil, err
						}
						return func() error { return m.Unlock(context.Background()) }, nil
					}
				}
			}},
		},
	}
}

func mysqlGroup() group {
	dsn := os.Getenv("SHOP_TEST_MYSQL_DSN")
	open := func(b *testing.B) *gorm.DB {
		base, err := sql.Open("mysql", dsn)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := base.Exec("CREATE DATABASE IF NOT EXISTS shop_bench"); err != nil {
			b.Fatal(err)
		}
		_ = base.Close()
		db, err := gorm.Open(gormmysql.Open(strings.Replace(dsn, "/?", "/shop_bench?", 1)), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			b.Fatal(err)
		}
		sqlDB, _ := db.DB()
		sqlDB.SetMaxOpenConns(64)
		sqlDB.SetMaxIdleConns(64)
		b.Cleanup(func() { _ = sqlDB.Close() })
		return db
	}
	return group{
		name: "mariadb",
		env:  "SHOP_TEST_MYSQL_DSN",
		roundTrip: func(b *testing.B) func(context.Context) error {
			db := open(b)
			return func(ctx context.Context) error { return db.WithContext(ctx).Exec("SELECT 1").Error }
		},
		writeRoundTrip: func(b *testing.B) func(context.Context) error {
			db := open(b)
			if err := db.Exec("CREATE TABLE IF NOT EXISTS bench_write (id INT PRIMARY KEY, n BIGINT NOT NULL)").Error; err != nil {
				b.Fatal(err)
			}
			if err := db.Exec("INSERT IGNORE INTO bench_write VALUES (1, 0)").Error; err != nil {
				b.Fatal(err)
			}
			return func(ctx context.Context) error {
				return db.WithContext(ctx).Exec("UPDATE bench_write SET n = n + 1 WHERE id = 1").Error
			}
		},
		subjects: []subject{
			{name: "shop-mysql-lease-row", backend: "mysql", open: shared(func(b *testing.B) Acquirer {
				l, err := mysqllock.New(open(b), mysqllock.WithTable("bench_locks"))
				return lockkitAcquirer(closeWith(b, l, err), long)
			})},
			{name: "shop-mysql-forupdate", backend: "mysql-forupdate", open: shared(func(b *testing.B) Acquirer {
				l, err := mysqllock.NewForUpdate(open(b), mysqllock.WithTable("bench_row_locks"), mysqllock.WithIdleConns(40))
				return lockkitAcquirer(closeWith(b, l, err), long)
			})},
			// The server's own named lock, which MySQL lock libraries wrap:
			// one connection held from GET_LOCK to RELEASE_LOCK.
			{name: "mariadb-GET_LOCK", open: shared(func(b *testing.B) Acquirer {
				sqlDB, err := open(b).DB()
				if err != nil {
					b.Fatal(err)
				}
				return getLockAcquirer(sqlDB)
			})},
		},
	}
}

func memcachedGroup() group {
	addr := os.Getenv("SHOP_TEST_MEMCACHED_ADDR")
	return group{
		name: "memcached",
		env:  "SHOP_TEST_MEMCACHED_ADDR",
		roundTrip: func(b *testing.B) func(context.Context) error {
			c := memcache.New(addr)
			return func(context.Context) error {
				if _, err := c.Get("bench-missing"); !errors.Is(err, memcache.ErrCacheMiss) {
					return fmt.Errorf("get of a missing key: %v", err)
				}
				return nil
			}
		},
		subjects: []subject{
			{name: "shop-memcached", backend: "memcached", open: shared(func(b *testing.B) Acquirer {
				c := memcache.New(addr)
				c.MaxIdleConns = 64
				return lockkitAcquirer(closeWith(b, lockkit.WithKeyPrefix(memcachedlock.New(c), "bench:"), nil), long)
			})},
		},
	}
}

func getLockAcquirer(db *sql.DB) Acquirer {
	return func(ctx context.Context, key string) (func() error, error) {
		conn, err := db.Conn(ctx)
		if err != nil {
			return nil, err
		}
		var got sql.NullInt64
		// GET_LOCK waits in whole seconds; ctx ends the wait sooner.
		if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 10)", "bench:"+key).Scan(&got); err != nil || got.Int64 != 1 {
			_ = conn.Close()
			if err == nil {
				err = fmt.Errorf("GET_LOCK(%q) = %v", key, got)
			}
			return nil, err
		}
		return func() error {
			defer conn.Close()
			return conn.QueryRowContext(context.Background(), "SELECT RELEASE_LOCK(?)", "bench:"+key).Scan(&got)
		}, nil
	}
}

// zkWrite is one setData on a node of its own: a write the leader logs
// to disk before it answers.
func zkWrite(b *testing.B, c *zk.Conn) func(context.Context) error {
	const path = "/bench-write"
	if _, err := c.Create(path, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		b.Fatal(err)
	}
	return func(context.Context) error { _, err := c.Set(path, []byte("x"), -1); return err }
}

func etcdWrite(c *clientv3.Client) func(context.Context) error {
	return func(ctx context.Context) error { _, err := c.Put(ctx, "/bench/write", "x"); return err }
}
