//go:build unix

package snapshot

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
)

// lockFile takes an exclusive, non-blocking flock on path. The kernel
// drops it when the process dies, so a killed host never leaves the
// shadow repository locked.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("snapshot: lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		return nil, fmt.Errorf("snapshot: lock: %w", err)
	}
	return f, nil
}

// killGroup runs cmd in a process group of its own and makes its
// cancellation kill the whole group, so nothing git started outlives it.
func killGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error {
		err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if errors.Is(err, syscall.ESRCH) {
			return os.ErrProcessDone
		}
		return err
	}
}

// readable says whether the host may read the file at path.
func readable(path string) bool {
	return syscall.Access(path, 4 /* R_OK */) == nil
}

// folderOwner is the uid and gid of the folder root when the host runs as
// root and the folder is another user's (nil otherwise): what a restore
// creates there is theirs.
func folderOwner(root *os.Root) *[2]int {
	if os.Geteuid() != 0 {
		return nil
	}
	fi, err := root.Stat(".")
	if err != nil {
		return nil
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok || st.Uid == 0 {
		return nil
	}
	return &[2]int{int(st.Uid), int(st.Gid)}
}
