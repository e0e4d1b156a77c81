//go:build linux && !amd64 && !arm64

package confine

import "golang.org/x/sys/unix"

// Other Linux architectures get no seccomp filter (its syscall table is
// kept for amd64 and arm64): capabilities, no_new_privs, Landlock and the
// agent's uid still hold; doctor and Enforces say so.
const seccompSupported = false

func seccompFilter(*Policy) ([]unix.SockFilter, error) { return nil, nil }

func installSeccomp([]unix.SockFilter) error { return nil }
