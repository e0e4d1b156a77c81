//go:build unix && !linux

package custody

import "syscall"

// procAlive reports whether pid names a process (no start time here).
func procAlive(pid int) bool {
	err := syscall.Kill(pid, 0)
	return err == nil || err == syscall.EPERM
}
