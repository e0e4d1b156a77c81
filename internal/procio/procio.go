// Package procio starts a command with stdio pipes whose host ends the
// caller owns: closing them is the caller's decision, and Wait never waits
// on a descendant that inherited the child's ends.
package procio

import (
	"fmt"
	"os"
	"os/exec"
)

// Pipes are the host's ends of a started command's stdin, stdout and stderr.
type Pipes struct {
	Stdin  *os.File // write end
	Stdout *os.File // read end
	Stderr *os.File // read end
}

// Close closes all three; errors (already closed) are ignored.
func (p Pipes) Close() {
	p.Stdin.Close()
	p.Stdout.Close()
	if p.Stderr != nil {
		p.Stderr.Close()
	}
}

// Start starts cmd with fresh pipes as its stdin, stdout and stderr (which
// must be nil) and closes the child's ends in the host once it runs. On
// error nothing is left open.
func Start(cmd *exec.Cmd) (Pipes, error) { return start(cmd, false) }

// StartCombined is Start with stderr on the stdout pipe, in the order the
// child wrote (as 2>&1); Pipes.Stderr is nil.
func StartCombined(cmd *exec.Cmd) (Pipes, error) { return start(cmd, true) }

func start(cmd *exec.Cmd, combined bool) (Pipes, error) {
	if cmd.Stdin != nil || cmd.Stdout != nil || cmd.Stderr != nil {
		return Pipes{}, fmt.Errorf("procio: the command's stdio must be unset")
	}
	var host, child [3]*os.File
	closeAll := func() {
		for _, f := range append(host[:], child[:]...) {
			if f != nil {
				f.Close()
			}
		}
	}
	for i := range host {
		if i == 2 && combined {
			break
		}
		r, w, err := os.Pipe()
		if err != nil {
			closeAll()
			return Pipes{}, err
		}
		if i == 0 { // stdin: the child reads
			child[i], host[i] = r, w
		} else {
			host[i], child[i] = r, w
		}
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = child[0], child[1], child[2]
	if combined {
		cmd.Stderr = child[1]
	}
	if err := cmd.Start(); err != nil {
		closeAll()
		return Pipes{}, err
	}
	for _, f := range child {
		f.Close()
	}
	return Pipes{Stdin: host[0], Stdout: host[1], Stderr: host[2]}, nil
}
