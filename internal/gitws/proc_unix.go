//go:build unix

package gitws

import (
	"errors"
	"os"
	"os/exec"
	"syscall"
)

// setGroup runs cmd in a session of its own (so nothing it starts, ssh included, has a terminal
// to prompt on) and makes a cancel kill the whole process group: git's helpers (ssh,
// git-remote-https, upload-pack, credential helpers) die with it.
func setGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Cancel = func() error {
		err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		if errors.Is(err, syscall.ESRCH) {
			return os.ErrProcessDone
		}
		return err
	}
}
