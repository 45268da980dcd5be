//go:build unix

package lockbench

import (
	"syscall"
	"time"
)

// processCPU is the user and system time this process has used: the
// client's own cost per cycle, which a busy machine disturbs far less
// than the wall clock.
func processCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
