//go:build unix

package snapshot

import (
	"syscall"
	"time"
)

// childCPU is the CPU time (user and system) of the waited-for child
// processes so far: git's work, apart from the machine's load.
func childCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
