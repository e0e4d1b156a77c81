//go:build linux

package confine

import "golang.org/x/sys/unix"

// amd64: x32 syscalls are the native architecture's with this bit set in
// the number; mknod exists beside mknodat.
const (
	auditArch = unix.AUDIT_ARCH_X86_64
	x32Bit    = 0x40000000
	sysMknod  = unix.SYS_MKNOD
)
