package redislock_test

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

// blackHole is a Redis address that accepts connections and never answers.
func blackHole(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	accepted := make(chan struct{})
	go func() {
		defer close(accepted)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = ln.Close()
		<-accepted
		for _, c := range conns {
			_ = c.Close()
		}
	})
	return ln.Addr().String()
}

// go-redis's default ignores the context's deadline on a connection that
// stopped answering: a Locker on such a client could not keep a wait
// timeout, so New refuses it and says why.
func TestNewRefusesAClientThatIgnoresDeadlines(t *testing.T) {
	addr := blackHole(t)
	for name, c := range map[string]redis.UniversalClient{
		"single":  redis.NewClient(&redis.Options{Addr: addr}),
		"cluster": redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}}),
	} {
		t.Run(name, func(t *testing.T) {
			defer c.Close()
			l, err := redislock.New(c)
			if !errors.Is(err, redislock.ErrDeadlinesIgnored) {
				if l != nil {
					_ = l.Close()
				}
				t.Fatalf("New = %v, want ErrDeadlinesIgnored", err)
			}
		})
	}
}

// With ContextTimeoutEnabled the wait timeout bounds an Acquire on a
// server that never answers, however long the client's own read timeout.
func TestAcquireOnASilentServerEndsWithItsWaitTimeout(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: blackHole(t), ContextTimeoutEnabled: true,
		ReadTimeout: time.Hour, WriteTimeout: time.Hour, MaxRetries: -1})
	defer c.Close()
	l, err := redislock.New(c)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	done := make(chan error, 1)
	go func() {
		_, err := l.Acquire(context.Background(), "k", lockkit.WithWaitTimeout(200*time.Millisecond))
		done <- err
	}()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("Acquire on a silent server succeeded")
		}
	case <-time.After(time.Minute): // far past 200 ms, far below the hour
		t.Fatal("Acquire ignored its wait timeout on a silent server")
	}
}
