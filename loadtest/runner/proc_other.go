//go:build !linux

package main

import (
	"syscall"
	"time"
)

// childAttr: only Linux can tie a child's life to its parent's; elsewhere
// the runner's own cleanup is all there is.
func childAttr() *syscall.SysProcAttr { return nil }

// processCPU and selfCPU are read from /proc and getrusage on Linux only.
func processCPU(int) time.Duration { return 0 }
func selfCPU() time.Duration       { return 0 }

// ownsLocalPort needs /proc: elsewhere no process is found to own a port.
func ownsLocalPort(int, int) bool { return false }
