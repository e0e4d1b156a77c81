//go:build !linux

package confine

import "errors"

// Reveal is Linux's (agents run as uids of their own only there).
func Reveal(pid int, folders ...string) error {
	return errors.New("confine: revealing folders to an agent is Linux-only")
}
