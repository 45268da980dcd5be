package lockbench

import (
	"syscall"
	"time"
)

// criticalSection stands for a holder's work of d. It sleeps in the kernel,
// not on a Go timer: the runtime's poller waits in whole milliseconds, so
// a 1 ms time.Sleep that network replies interrupt ends 0.1-0.5 ms late,
// by more the busier the process is, and would charge a lock for the
// traffic of its waiters.
func criticalSection(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}
