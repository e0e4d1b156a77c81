//go:build !linux

package confine

import "errors"

// KernelABI returns 0: Landlock is Linux's.
func KernelABI() int { return 0 }

func restrict(*Policy) error { return errors.New("confinement needs Landlock, which is Linux-only") }

func execve(string, []string, []string) error { return errors.New("not supported on this platform") }
