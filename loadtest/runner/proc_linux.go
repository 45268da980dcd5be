package main

import "syscall"

// childAttr makes the kernel send SIGTERM to shop and k6 if the runner dies
// without stopping them (kill -9, a crash): no instance outlives its run.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
