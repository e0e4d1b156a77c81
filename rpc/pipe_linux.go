//go:build linux

package rpc

import (
	"io"
	"syscall"
)

// The pipe size commands of fcntl(2) (Linux 2.6.35), which the syscall
// package does not name; the protocol client uses the standard library
// alone.
const (
	fSetPipeSize = 1031 // F_SETPIPE_SZ
	fGetPipeSize = 1032 // F_GETPIPE_SZ
)

// fcntl runs fcntl(2) with an int argument.
func fcntl(fd uintptr, cmd, arg int) (int, error) {
	r, _, errno := syscall.Syscall(syscall.SYS_FCNTL, fd, uintptr(cmd), uintptr(arg))
	if errno != 0 {
		return 0, errno
	}
	return int(r), nil
}

// pipeResizer returns what raises the pipe r reads from to floodBuf bytes
// while the agent floods and sets it back to its own size after, or nil
// when r is not a pipe (a file, a socket, a test's reader). A bigger pipe
// lets the agent write on while the reader works, and the reader take a
// flood in fuller reads: both sides sleep and wake less.
//
// Raised only while flooding, because an unprivileged user's pipes share
// an allowance (fs.pipe-user-pages-soft, 64 MiB by default): a pipe kept at
// 128 KiB for every idle agent would use it up at 512 agents, and then
// every new pipe of that user is created at 8 KiB.
//
// An agent started through GroupStarter or custody writes to a unix socket
// on Linux (internal/procio), not a pipe: nothing to resize. A socket
// buffers up to its sender's SO_SNDBUF (net.core.wmem_default, 208 KiB by
// default, counting the kernel's overhead per write), charged only while
// it holds data, so a flood's reads already come near floodBuf (109 KiB
// on average in procio's BenchmarkStdout, 1 MiB writes). A larger
// SO_SNDBUF (up to 4 MiB) made no measurable difference there, with 1 KiB
// frames written one a write either.
func pipeResizer(r io.Reader) func(flooding bool) {
	sc, ok := r.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	base := 0
	_ = rc.Control(func(fd uintptr) {
		var st syscall.Stat_t
		if syscall.Fstat(int(fd), &st) != nil || st.Mode&syscall.S_IFMT != syscall.S_IFIFO {
			return
		}
		if n, err := fcntl(fd, fGetPipeSize, 0); err == nil {
			base = n
		}
	})
	if base <= 0 || base >= floodBuf {
		return nil
	}
	return func(flooding bool) {
		size := base
		if flooding {
			size = floodBuf
		}
		// A refusal only costs speed: EPERM past the user's allowance or
		// fs.pipe-max-size, EBUSY when the pipe holds more than the
		// smaller size (it is tried again after the next flood).
		_ = rc.Control(func(fd uintptr) { _, _ = fcntl(fd, fSetPipeSize, size) })
	}
}
