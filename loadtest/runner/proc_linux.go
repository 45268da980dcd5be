package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// childAttr makes the kernel send SIGTERM to shop and k6 if the runner dies
// without stopping them (kill -9, a crash): no instance outlives its run.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}

// processCPU is the user and system CPU pid has used, from /proc; 0 if it
// cannot be read (the process has gone).
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	// The command name, in brackets, may hold spaces: count from after it.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * time.Second / clockTicks
}

// clockTicks is USER_HZ, the unit of /proc's CPU times: 100 on every Linux
// the kernel's ABI supports.
const clockTicks = 100

// selfCPU is the user and system CPU the runner has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
