//go:build windows

package custody

import (
	"os"
	"os/exec"
)

// sysSignal on Windows: only killing exists; TERM and KILL both kill the
// leader. Its descendants are not reached (job objects are future work).
type sysSignal int

const (
	sigTerm sysSignal = 15
	sigKill sysSignal = 9
)

func prepareGroup(*exec.Cmd) {}

func signalProcess(p *os.Process, _ sysSignal) error { return p.Kill() }

func signalGroupOther(int, sysSignal) {}

// setCtty: Windows has no controlling terminals.
func setCtty(cmd *exec.Cmd) {}
