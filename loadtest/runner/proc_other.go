//go:build !linux

package main

import "syscall"

// childAttr: only Linux can tie a child's life to its parent's; elsewhere
// the runner's own cleanup is all there is.
func childAttr() *syscall.SysProcAttr { return nil }
