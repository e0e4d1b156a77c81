//go:build unix && !linux

package custody

import (
	"os"
	"os/exec"
	"syscall"
)

type sysSignal = syscall.Signal

const (
	sigTerm = syscall.SIGTERM
	sigKill = syscall.SIGKILL
)

func prepareGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
}

func signalProcess(p *os.Process, sig sysSignal) error { return p.Signal(sig) }

func signalGroupOther(pid int, sig sysSignal) { _ = syscall.Kill(-pid, sig) }

// setCtty makes the child's fd 0 its controlling terminal.
func setCtty(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
}
