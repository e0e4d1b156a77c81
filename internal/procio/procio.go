// Package procio starts a command with stdio channels whose host ends the
// caller owns: closing them is the caller's decision, and Wait never waits
// on a descendant that inherited the child's ends (the child's ends are
// *os.File, so os/exec copies nothing and Wait does not wait for EOF).
//
// # Sockets, not pipes (Linux)
//
// On Linux each of the command's stdin, stdout and stderr is one end of a
// connected unix stream socket pair (socketpair(2), SOCK_STREAM), and the
// host keeps the other end (close-on-exec, non-blocking under Go's
// poller, so deadlines and Close work as they do on a pipe). A pipe can be
// reopened by path: any process of the same user (and, under Landlock,
// the same domain) opens /proc/PID/fd/0 of the agent and writes frames
// into its stdin, or opens /proc/PID/fd/1 and reads frames before the host
// does. A socket cannot be reopened that way (open(2) of it fails with
// ENXIO), so only the host and what inherited a descriptor hold the
// channel. The direction a stream does not use is shut down on both ends
// (shutdown(2)) before the command starts: the command cannot write into
// its stdin or read from its stdout and stderr, and the host cannot do the
// reverse, so even a process that inherits one of the command's
// descriptors (or copies it, with pidfd_getfd) can use it only the way the
// command does.
//
// What stays the same as with pipes: closing the host's stdin end gives the
// command EOF; the exit of the command and of every descendant that
// inherited its stdout gives the host EOF; a write to a closed peer fails (EPIPE, or
// ECONNRESET when the peer left unread data behind). What a command sees
// differently: fstat reports a socket, not a FIFO, and opening
// /dev/stdin, /dev/stdout or /dev/stderr (links into /proc/self/fd) fails
// with ENXIO, as it does for a service whose output systemd's journal
// takes; node and bun read and write socket stdio as they do pipes (node's
// own child processes get socket pairs, not pipes).
//
// What it costs: the kernel allocates a buffer for each write to a socket,
// where a pipe fills pages. With one 1 KiB frame a write from a Go child,
// both sides spend about twice a pipe's CPU (BenchmarkStdout: about 1.3 µs
// a frame each instead of 0.65); with 1 MiB writes a socket is as fast as a
// pipe or faster. Agents writing a frame a call: node (which gathers what
// the reader has not taken into larger writes) costs what it does on a
// pipe; bun, when the reader keeps up, about 0.4 µs more a frame on each
// side. agenthost bench's flood (large writes) reads no slower.
//
// Other platforms keep pipes (os.Pipe): they have no /proc to reopen them
// through.
package procio

import (
	"fmt"
	"os"
	"os/exec"
)

// Pipes are the host's ends of a started command's stdin, stdout and
// stderr: on Linux unix socket ends, elsewhere pipe ends.
type Pipes struct {
	Stdin  *os.File // the host writes; the command reads
	Stdout *os.File // the host reads; the command writes
	Stderr *os.File // the host reads; nil after StartCombined
}

// Close closes all three; errors (already closed) are ignored.
func (p Pipes) Close() {
	p.Stdin.Close()
	p.Stdout.Close()
	if p.Stderr != nil {
		p.Stderr.Close()
	}
}

// Start starts cmd with fresh channels as its stdin, stdout and stderr
// (which must be nil) and closes the child's ends in the host once it
// runs. On error nothing is left open.
func Start(cmd *exec.Cmd) (Pipes, error) { return start(cmd, false) }

// StartCombined is Start with stderr on the stdout channel, in the order
// the child wrote (as 2>&1); Pipes.Stderr is nil.
func StartCombined(cmd *exec.Cmd) (Pipes, error) { return start(cmd, true) }

// names are the host ends' names (in their errors).
var names = [3]string{"|stdin", "|stdout", "|stderr"}

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
		h, c, err := newChannel(names[i], i == 0)
		if err != nil {
			closeAll()
			return Pipes{}, fmt.Errorf("procio: %s: %w", names[i][1:], err)
		}
		host[i], child[i] = h, c
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
		if f != nil {
			f.Close()
		}
	}
	return Pipes{Stdin: host[0], Stdout: host[1], Stderr: host[2]}, nil
}
