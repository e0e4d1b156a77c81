//go:build !linux

package confine

import "errors"

// KernelABI returns 0: Landlock is Linux's.
func KernelABI() int { return 0 }

const seccompSupported = false

func start(*Policy, []string, []string) error {
	return errors.New("confinement needs Landlock, which is Linux-only")
}

func prepareTmp(string, bool, *User) error { return errors.New("confinement is Linux-only") }
