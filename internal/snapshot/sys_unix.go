//go:build unix

package snapshot

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// lockGrace is how long Open waits for a lock held by a process it did
// not start on purpose: a child this process is starting holds a copy of
// every open file (the repository's lock too, though close-on-exec) from
// its fork until its exec, a moment on an idle machine, longer on a busy
// one, and a room's repository opened again (its room purged and made
// anew) while another room's agent starts met that copy. Another Repo
// that holds the directory holds it for good: Open fails after lockGrace.
const lockGrace = 2 * time.Second

// lockFile takes an exclusive flock on path, trying again for grace (or
// until ctx ends) while it is held. The kernel drops it when the process
// dies, so a killed host never leaves the shadow repository locked.
func lockFile(ctx context.Context, path string, grace time.Duration) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("snapshot: lock: %w", err)
	}
	deadline := time.Now().Add(grace)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, fmt.Errorf("snapshot: lock: %w", err)
		}
		if !time.Now().Before(deadline) || ctx.Err() != nil {
			_ = f.Close()
			return nil, fmt.Errorf("%w: %s", ErrLocked, path)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
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
