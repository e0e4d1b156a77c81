//go:build windows

package custody

import (
	"os/exec"
	"syscall"
	"time"
)

// Windows cannot stop a process where it is: no hold, no fuse.
const canFreeze = false

var (
	sigStopSyscall = syscall.Signal(0)
	sigContSyscall = syscall.Signal(0)
	sigKillSyscall = syscall.SIGKILL
)

var monoStart = time.Now()

func monoNow() int64 { return int64(time.Since(monoStart)) }

func fuseGroup(*exec.Cmd) {}

func freezeTarget(*fuseTarget) {}
func thawTarget(*fuseTarget)   {}
func killTarget(*fuseTarget)   {}
func cgroupExists(string) bool { return false }
func procAlive(int) bool       { return false }
