//go:build unix

package custody

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

const canFreeze = true

var (
	sigStopSyscall = syscall.SIGSTOP
	sigContSyscall = syscall.SIGCONT
	sigKillSyscall = syscall.SIGKILL
)

// monoNow reads the system's monotonic clock (the same in every process).
func monoNow() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

func fuseGroup(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}

// A target's process group is its leader's pid (custody starts each scope
// in its own session); it is signalled only while the leader is the
// process the hold named.

func freezeTarget(t *fuseTarget) {
	writeCgroup(t.cgroup, "cgroup.freeze", "1")
	if t.alive() {
		_ = syscall.Kill(-t.pid, syscall.SIGSTOP)
	}
}

func thawTarget(t *fuseTarget) {
	if t.alive() {
		_ = syscall.Kill(-t.pid, syscall.SIGCONT)
	}
	writeCgroup(t.cgroup, "cgroup.freeze", "0")
}

func killTarget(t *fuseTarget) {
	writeCgroup(t.cgroup, "cgroup.kill", "1")
	if t.alive() {
		_ = syscall.Kill(-t.pid, syscall.SIGKILL)
	}
}

func writeCgroup(dir, file, v string) {
	if dir != "" {
		_ = os.WriteFile(filepath.Join(dir, file), []byte(v), 0)
	}
}

func cgroupExists(dir string) bool {
	if dir == "" {
		return false
	}
	_, err := os.Stat(dir)
	return err == nil
}
