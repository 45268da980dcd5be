//go:build linux

// Command rediscycles runs uncontended acquire + release cycles of one
// lockbench Redis subject, for scripts/redis-instructions.sh to count the
// client's instructions under callgrind. A run is start-up and the cycles,
// nothing else, so the difference of two runs is the cycles alone. The
// script runs it without the signals of asynchronous preemption, which
// callgrind does not survive.
//
//	rediscycles -addr 127.0.0.1:6379 -subject shop-redis -cycles 1000
//
// Beside the script's settings, two things keep the Go scheduler's timing
// out of the count, so that it repeats on a loaded machine: the loop yields
// once per cycle, and a read waits for its reply outside the scheduler
// (answeredConn). Both cost every subject the same.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"runtime"
	"syscall"
	"unsafe"

	"github.com/redis/go-redis/v9"

	"github.com/lockbench/shop/internal/lockkit/lockbench"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "Redis server")
	name := flag.String("subject", "shop-redis", "a lockbench.RedisSubjects name")
	cycles := flag.Int("cycles", 1000, "acquire + release cycles")
	flag.Parse()
	if err := run(*addr, *name, *cycles); err != nil {
		log.Fatal(err)
	}
}

func run(addr, name string, cycles int) error {
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true, Dialer: dialAnswered})
	defer c.Close()
	for _, s := range lockbench.RedisSubjects() {
		if s.Name != name {
			continue
		}
		cycle, closer, err := s.Open(c)
		if err != nil {
			return err
		}
		defer closer()
		ctx := context.Background()
		for i := range cycles {
			if err := cycle(ctx, fmt.Sprintf("k%d", i%16)); err != nil {
				return err
			}
			// A goroutine that never yields is preempted every 10 ms of
			// wall time, and under callgrind that is every few cycles.
			runtime.Gosched()
		}
		return nil
	}
	return fmt.Errorf("no Redis subject %q", name)
}

// answeredConn reads only once the reply is there, having waited for it in
// a raw ppoll that the scheduler does not see. A read that found no reply
// would park its goroutine until the netpoller woke it, and whether it does
// depends on how soon the server answers: on a loaded machine, at random.
type answeredConn struct {
	*net.TCPConn // whose SyscallConn go-redis's health check uses
	raw          syscall.RawConn
}

func dialAnswered(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tcp := c.(*net.TCPConn)
	raw, err := tcp.SyscallConn()
	if err != nil {
		return nil, err
	}
	return &answeredConn{TCPConn: tcp, raw: raw}, nil
}

func (c *answeredConn) Read(b []byte) (int, error) {
	err := c.raw.Control(func(fd uintptr) {
		p := struct {
			fd             int32
			events, revent int16
		}{fd: int32(fd), events: 0x1} // POLLIN
		timeout := syscall.Timespec{Sec: 10}
		syscall.RawSyscall6(syscall.SYS_PPOLL, uintptr(unsafe.Pointer(&p)), 1, uintptr(unsafe.Pointer(&timeout)), 0, 0, 0)
	})
	if err != nil {
		return 0, err
	}
	return c.TCPConn.Read(b)
}
