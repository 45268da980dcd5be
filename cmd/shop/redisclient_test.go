package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/lockbench/shop/internal/config"
	"github.com/lockbench/shop/internal/lockkit/redislock"
)

// An Acquire against a Redis that stopped answering (a black hole: the
// connection is accepted, nothing comes back) returns within its context's
// budget and a small bound, not after go-redis's read timeouts and retries.
func TestRedisClientHonoursContextDuringOutage(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(io.Discard, c); c.Close() }()
		}
	}()

	a := &app{}
	rdb, err := openRedis(config.Config{RedisAddrs: []string{ln.Addr().String()}}, a, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		for _, c := range a.closers {
			_ = c()
		}
	}()
	locker, err := redislock.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	defer locker.Close()

	const budget, slack = 200 * time.Millisecond, 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), budget)
	defer cancel()
	start := time.Now()
	_, err = locker.Acquire(ctx, "outage")
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("acquire against a black hole: %v, want the context's deadline", err)
	}
	if d := time.Since(start); d > budget+slack {
		t.Errorf("acquire with a %v budget returned after %v", budget, d)
	}
}
