package confine

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"
)

// Securebits (linux/securebits.h), each with its lock: uid 0 gets no
// capability by executing anything (noroot), changing uids neither drops
// nor grants any (no_setuid_fixup: the launcher drops them itself), and
// no ambient capability can be raised; keep_caps stays off, locked.
const (
	secbitNoRoot                  = 1 << 0
	secbitNoRootLocked            = 1 << 1
	secbitNoSetuidFixup           = 1 << 2
	secbitNoSetuidFixupLocked     = 1 << 3
	secbitKeepCapsLocked          = 1 << 5
	secbitNoCapAmbientRaise       = 1 << 6
	secbitNoCapAmbientRaiseLocked = 1 << 7

	lockedSecurebits = secbitNoRoot | secbitNoRootLocked | secbitNoSetuidFixup | secbitNoSetuidFixupLocked |
		secbitKeepCapsLocked | secbitNoCapAmbientRaise | secbitNoCapAmbientRaiseLocked
)

// dropPrivilege leaves the calling thread (the launcher's) no capability
// and, with u, runs it as u: the bounding set emptied and the securebits
// set and locked where it may (CAP_SETPCAP, which a root launcher has),
// ambient capabilities cleared, groups, gid and uid switched to u's, then
// effective, permitted and inheritable capabilities zeroed. With
// no_new_privs (set next) nothing the agent executes gains any back. A
// launcher without CAP_SETPCAP (not root) keeps its bounding set and
// securebits, which no_new_privs and an empty permitted set make moot.
func dropPrivilege(u *User) error {
	setpcap, err := hasCap(unix.CAP_SETPCAP)
	if err != nil {
		return err
	}
	if setpcap {
		for c := 0; ; c++ {
			if _, err := unix.PrctlRetInt(unix.PR_CAPBSET_READ, uintptr(c), 0, 0, 0); errors.Is(err, unix.EINVAL) {
				break // past the kernel's last capability
			}
			if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil {
				return fmt.Errorf("dropping capability %d from the bounding set: %w", c, err)
			}
		}
	}
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil {
		return fmt.Errorf("clearing the ambient capabilities: %w", err)
	}
	if setpcap {
		// EPERM: locked already by whoever started the server.
		if err := unix.Prctl(unix.PR_SET_SECUREBITS, lockedSecurebits, 0, 0, 0); err != nil && !errors.Is(err, unix.EPERM) {
			return fmt.Errorf("setting the securebits: %w", err)
		}
	}
	if u != nil {
		// Go's set*id run on every thread of the process (this one too).
		if err := syscall.Setgroups(nil); err != nil {
			return fmt.Errorf("dropping the supplementary groups: %w", err)
		}
		if err := syscall.Setresgid(u.GID, u.GID, u.GID); err != nil {
			return fmt.Errorf("switching to gid %d: %w", u.GID, err)
		}
		if err := syscall.Setresuid(u.UID, u.UID, u.UID); err != nil {
			return fmt.Errorf("switching to uid %d: %w", u.UID, err)
		}
	}
	var none [2]unix.CapUserData
	if err := unix.Capset(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &none[0]); err != nil {
		return fmt.Errorf("dropping the capabilities: %w", err)
	}
	return nil
}

// hasCap reports whether the calling thread has capability c effective.
func hasCap(c int) (bool, error) {
	var data [2]unix.CapUserData
	if err := unix.Capget(&unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}, &data[0]); err != nil {
		return false, fmt.Errorf("reading the capabilities: %w", err)
	}
	return data[c/32].Effective&(1<<(c%32)) != 0, nil
}
