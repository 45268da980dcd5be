//go:build !linux

package lockbench

import "time"

// criticalSection stands for a holder's work of d (sleep_linux.go says why
// Linux sleeps in the kernel instead).
func criticalSection(d time.Duration) { time.Sleep(d) }
