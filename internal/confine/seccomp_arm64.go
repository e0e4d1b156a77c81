//go:build linux

package confine

import "golang.org/x/sys/unix"

// arm64: no x32-like ABI and no mknod (mknodat only).
const (
	auditArch = unix.AUDIT_ARCH_AARCH64
	x32Bit    = 0
	sysMknod  = -1 // none
)
