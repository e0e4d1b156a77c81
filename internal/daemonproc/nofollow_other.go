//go:build !unix

package daemonproc

// noFollow is 0 where open(2) has no O_NOFOLLOW (the daemon, whose files
// these are, runs on Linux only).
const noFollow = 0
