//go:build unix

package bench

import (
	"syscall"
	"time"
)

// selfCPU is this process's user and system CPU time.
func selfCPU() (user, sys time.Duration) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) != nil {
		return 0, 0
	}
	return time.Duration(ru.Utime.Nano()), time.Duration(ru.Stime.Nano())
}
