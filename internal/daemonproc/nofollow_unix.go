//go:build unix

package daemonproc

import "syscall"

// noFollow: an output file is never opened through a link.
const noFollow = syscall.O_NOFOLLOW
