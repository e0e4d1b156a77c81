//go:build !unix

package rpc

import (
	"os"
	"os/exec"
)

// On platforms without process groups only the agent itself is signalled;
// its descendants are not reached.
var (
	sigTerm = os.Kill
	sigKill = os.Kill
)

func setProcessGroup(cmd *exec.Cmd) {}

func signalGroup(cmd *exec.Cmd, sig os.Signal) {
	if cmd.Process != nil {
		_ = cmd.Process.Signal(sig)
	}
}

// groupAlive: without process groups there is nothing left to wait for.
func groupAlive(cmd *exec.Cmd) bool { return false }
