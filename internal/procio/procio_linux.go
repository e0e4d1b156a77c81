//go:build linux

package procio

import (
	"os"
	"syscall"
)

// newChannel is a connected unix stream socket pair for one stdio stream
// (see the package doc): the host's end close-on-exec and non-blocking (Go's
// poller then serves it, with deadlines, and Close wakes a blocked Read or
// Write), the child's end blocking, as a program expects its stdio. toChild:
// the host writes and the child reads (stdin); otherwise the reverse. The
// direction the stream does not use is shut down on both ends.
func newChannel(name string, toChild bool) (host, child *os.File, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, os.NewSyscallError("socketpair", err)
	}
	h, c := fds[0], fds[1]
	hostShut, childShut := syscall.SHUT_WR, syscall.SHUT_RD
	if toChild {
		hostShut, childShut = syscall.SHUT_RD, syscall.SHUT_WR
	}
	if err = syscall.Shutdown(h, hostShut); err == nil {
		if err = syscall.Shutdown(c, childShut); err == nil {
			err = syscall.SetNonblock(h, true)
		}
	}
	if err != nil {
		syscall.Close(h)
		syscall.Close(c)
		return nil, nil, os.NewSyscallError("socketpair setup", err)
	}
	return os.NewFile(uintptr(h), name), os.NewFile(uintptr(c), name), nil
}
