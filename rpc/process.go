package rpc

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/agenthost/agenthost/internal/procio"
)

// DefaultGrace is the default wait for an agent to exit on its own after
// stdin closes, and between SIGTERM and SIGKILL.
const DefaultGrace = time.Second

// GroupStarter is the built-in Starter, used when SpawnOptions.Starter is
// nil: the agent leads its own process group, and Stop closes stdin, waits
// Grace, then signals that group with SIGTERM and, after Grace again,
// SIGKILL. Descendants that leave the group (setsid) are out of its reach;
// the custody package covers those.
type GroupStarter struct {
	Grace time.Duration // default DefaultGrace
}

// Start implements Starter.
func (g GroupStarter) Start(ctx context.Context, cmd *exec.Cmd) (Process, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	setProcessGroup(cmd)
	pipes, err := procio.Start(cmd)
	if err != nil {
		return nil, err
	}
	grace := g.Grace
	if grace <= 0 {
		grace = DefaultGrace
	}
	p := &groupProcess{cmd: cmd, stdin: pipes.Stdin, stdout: pipes.Stdout, stderr: pipes.Stderr, exited: make(chan struct{}), grace: grace}
	go p.wait() // ends when the leader exits; Stop waits for it
	return p, nil
}

type groupProcess struct {
	cmd            *exec.Cmd
	stdin          io.WriteCloser
	stdout, stderr *os.File
	exited         chan struct{}
	exitErr        error
	grace          time.Duration
	stopOnce       sync.Once
	stopErr        error
	outOnce        sync.Once
}

func (p *groupProcess) wait() {
	p.exitErr = p.cmd.Wait()
	close(p.exited)
}

func (p *groupProcess) Stdin() io.WriteCloser   { return p.stdin }
func (p *groupProcess) Stdout() io.Reader       { return p.stdout }
func (p *groupProcess) Stderr() io.Reader       { return p.stderr }
func (p *groupProcess) Exited() <-chan struct{} { return p.exited }
func (p *groupProcess) ExitErr() error {
	select {
	case <-p.exited:
		return p.exitErr
	default:
		return nil
	}
}

func (p *groupProcess) CloseOutput() {
	p.outOnce.Do(func() {
		p.stdout.Close()
		p.stderr.Close()
	})
}

// Stop: stdin closed, grace, SIGTERM to the group, grace, SIGKILL to the
// group, then wait (bounded by ctx) for the leader to be reaped. When the
// leader exits before the KILL, the rest of its group still gets TERM and,
// if members remain after a grace (they ignore TERM), KILL.
func (p *groupProcess) Stop(ctx context.Context) error {
	p.stopOnce.Do(func() {
		_ = p.stdin.Close()
		if !p.waitFor(ctx, p.grace) {
			signalGroup(p.cmd, sigTerm)
			if !p.waitFor(ctx, p.grace) {
				signalGroup(p.cmd, sigKill)
				select {
				case <-p.exited:
				case <-ctx.Done():
					p.stopErr = fmt.Errorf("rpc: agent pid %d did not exit after SIGKILL: %w", p.cmd.Process.Pid, ctx.Err())
				}
				return
			}
		}
		// The leader is gone; stray members of its group may remain.
		signalGroup(p.cmd, sigTerm)
		if !p.waitGroupGone(ctx, p.grace) {
			signalGroup(p.cmd, sigKill)
		}
	})
	return p.stopErr
}

// waitGroupGone waits up to d for the agent's process group to empty. No
// event reports the exit of a process that is not our child, so it polls,
// at growing intervals.
func (p *groupProcess) waitGroupGone(ctx context.Context, d time.Duration) bool {
	deadline := time.Now().Add(d)
	wait := time.Millisecond
	for groupAlive(p.cmd) {
		left := time.Until(deadline)
		if left <= 0 {
			return false
		}
		t := time.NewTimer(min(wait, left))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return false
		}
		wait = min(2*wait, 50*time.Millisecond)
	}
	return true
}

func (p *groupProcess) waitFor(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.exited:
		return true
	case <-t.C:
		return false
	case <-ctx.Done():
		return false
	}
}
