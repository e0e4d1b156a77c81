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
	if t.cgroup == "" {
		t.stopped = signalBeyondGroup(t, syscall.SIGSTOP)
	}
}

func thawTarget(t *fuseTarget) {
	if t.alive() {
		_ = syscall.Kill(-t.pid, syscall.SIGCONT)
	}
	for _, id := range t.stopped {
		if st, ok := procStart(id.pid); ok && (id.start == 0 || st == id.start) {
			_ = syscall.Kill(id.pid, syscall.SIGCONT)
		}
	}
	t.stopped = nil
	writeCgroup(t.cgroup, "cgroup.freeze", "0")
}

func killTarget(t *fuseTarget) {
	writeCgroup(t.cgroup, "cgroup.kill", "1")
	var beyond []ident
	if t.cgroup == "" {
		// Found first, while the leader lives: its descendants are
		// known by their parent until it dies (then init's).
		beyond = scopeProcs(t)
	}
	if t.alive() {
		_ = syscall.Kill(-t.pid, syscall.SIGKILL)
	}
	for _, id := range beyond {
		if st, ok := procStart(id.pid); ok && (id.start == 0 || st == id.start) && id.pid != os.Getpid() && id.pid > 1 {
			_ = syscall.Kill(id.pid, syscall.SIGKILL)
		}
	}
	if t.cgroup == "" {
		signalBeyondGroup(t, syscall.SIGKILL)
	}
}

// signalBeyondGroup sends sig to the scope's processes a group signal
// misses (see the fuse's comment): its listed members, what carries its
// marker, and their descendants, looking again until it finds nothing new
// (a process stopped forks no more); it returns what it signalled.
func signalBeyondGroup(t *fuseTarget, sig syscall.Signal) []ident {
	var done []ident
	seen := map[ident]bool{}
	for pass := 0; pass < maxScopePasses; pass++ {
		found := 0
		for _, id := range scopeProcs(t) {
			if seen[id] || id.pid == os.Getpid() || id.pid <= 1 {
				continue
			}
			seen[id] = true
			found++
			if syscall.Kill(id.pid, sig) == nil {
				done = append(done, id)
			}
		}
		if found == 0 {
			break
		}
	}
	return done
}

// maxScopePasses bounds signalBeyondGroup's looks.
const maxScopePasses = 4

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
