// Package daemonproc runs RPC agents as pipe processes of the process
// daemon (package procd), so they outlive the host: stdin goes through the
// daemon's write request, stdout is read from the daemon's output file by
// offset, and a later host attaches to the same process at the offset its
// room recorded.
package daemonproc

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/procd"
	"github.com/agenthost/agenthost/rpc"
)

// Bounds on the daemon's requests.
const (
	// WriteTimeout bounds one write to the agent's stdin (the daemon
	// answers once the data is in the pipe, so a full pipe waits here).
	WriteTimeout = 30 * time.Second
	// StopTimeout bounds a terminate when Stop's context has none.
	StopTimeout = 30 * time.Second
	// exitAfterStop bounds how long Stop waits for the exit to be
	// reported after terminate answered.
	exitAfterStop = 2 * time.Second
)

// ErrNotRunning is returned by Attach for a process that has exited or is
// unknown to the daemon.
var ErrNotRunning = errors.New("daemonproc: the process is not running")

// Handle names a pipe process of the daemon and its output files; a room
// records it (as a string) to attach again after a restart.
type Handle struct {
	// Instance is the daemon's instance id: a fresh daemon's process of
	// the same id is another process.
	Instance string `json:"instance"`
	ID       string `json:"id"`
	Output   string `json:"output"`
	Stderr   string `json:"stderr"`
	// V2: the agent speaks RPC protocol v2 (negotiated at its start).
	V2 bool `json:"v2,omitempty"`
	// Ready: the agent announced itself with ready (omp) at its start.
	Ready bool `json:"ready,omitempty"`
}

// String is the handle as recorded.
func (h Handle) String() string {
	b, _ := json.Marshal(h)
	return string(b)
}

// ParseHandle reads a recorded handle.
func ParseHandle(s string) (Handle, error) {
	var h Handle
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return Handle{}, fmt.Errorf("daemonproc: handle: %w", err)
	}
	if h.ID == "" || !filepath.IsAbs(h.Output) || !filepath.IsAbs(h.Stderr) {
		return Handle{}, errors.New("daemonproc: handle: id and absolute output paths are required")
	}
	return h, nil
}

// Starter is an rpc.Starter that starts each agent as a pipe process of
// the daemon, its output files in Dir.
type Starter struct {
	Client *procd.Client
	// Dir holds the process's output files (created 0700 if missing).
	Dir string
}

var _ rpc.Starter = (*Starter)(nil)

// Start implements rpc.Starter: cmd's path, args, dir and environment
// (nil: this process's) go to create_pipe.
func (s *Starter) Start(ctx context.Context, cmd *exec.Cmd) (rpc.Process, error) {
	if s.Client == nil || !filepath.IsAbs(s.Dir) {
		return nil, errors.New("daemonproc: Starter needs a client and an absolute Dir")
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("daemonproc: %w", err)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	base := filepath.Join(s.Dir, "agent-"+hex.EncodeToString(b[:]))
	env := cmd.Env
	if env == nil {
		env = os.Environ()
	}
	dir := cmd.Dir
	if dir == "" {
		dir, _ = os.Getwd()
	}
	if !filepath.IsAbs(dir) {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return nil, fmt.Errorf("daemonproc: %w", err)
		}
		dir = abs
	}
	argv := append([]string{cmd.Path}, cmd.Args[1:]...)
	info, err := s.Client.CreatePipe(ctx, procd.PipeSpec{Argv: argv, Cwd: dir, Env: env,
		OutputPath: base + ".out", StderrPath: base + ".err"})
	if err != nil {
		return nil, fmt.Errorf("daemonproc: create_pipe: %w", err)
	}
	h := Handle{Instance: s.Client.InstanceID(), ID: info.ID, Output: base + ".out", Stderr: base + ".err"}
	p, err := open(s.Client, h, 0, 0)
	if err != nil {
		tctx, cancel := context.WithTimeout(context.Background(), StopTimeout)
		_, _ = s.Client.Terminate(tctx, info.ID)
		cancel()
		return nil, err
	}
	return p, nil
}

// Attach takes over the running process h, its stdout read from offset
// (its stderr from its current end). ErrNotRunning when it has exited or
// the daemon does not know it.
func Attach(ctx context.Context, c *procd.Client, h Handle, offset int64) (*Process, error) {
	if h.Instance != c.InstanceID() {
		return nil, fmt.Errorf("%w: %s was a process of daemon %s, this is %s", ErrNotRunning, h.ID, h.Instance, c.InstanceID())
	}
	info, err := c.Get(ctx, h.ID)
	if errors.Is(err, procd.ErrNotFound) {
		return nil, fmt.Errorf("%w: %s", ErrNotRunning, h.ID)
	}
	if err != nil {
		return nil, fmt.Errorf("daemonproc: get: %w", err)
	}
	if !info.Running {
		return nil, fmt.Errorf("%w: %s exited", ErrNotRunning, h.ID)
	}
	if info.Pipe == nil || info.Pipe.OutputPath != h.Output {
		return nil, fmt.Errorf("%w: %s is another process", ErrNotRunning, h.ID)
	}
	var errAt int64
	if fi, err := os.Stat(h.Stderr); err == nil {
		errAt = fi.Size()
	}
	return open(c, h, offset, errAt)
}

// Process is a pipe process of the daemon seen as an rpc.Process. Its
// stdout and stderr readers tail the output files, woken by their growth
// (inotify) or by the process's exit, never by polling.
type Process struct {
	c *procd.Client
	h Handle

	ctx    context.Context // the process's life in this host: cancelled by Stop, Detach
	cancel context.CancelFunc
	stdin  *stdin
	out    *tail
	errOut *tail

	exited  chan struct{}
	exitErr error // set before exited closes
	wg      sync.WaitGroup

	detached atomic.Bool
	stopOnce sync.Once
	stopErr  error
	receipt  *custody.Receipt // under mu
	mu       sync.Mutex
}

func open(c *procd.Client, h Handle, outAt, errAt int64) (*Process, error) {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Process{c: c, h: h, ctx: ctx, cancel: cancel, exited: make(chan struct{})}
	var err error
	if p.out, err = openTail(h.Output, outAt, p.exited); err != nil {
		cancel()
		return nil, err
	}
	if p.errOut, err = openTail(h.Stderr, errAt, p.exited); err != nil {
		p.out.Close()
		cancel()
		return nil, err
	}
	p.stdin = &stdin{p: p}
	p.wg.Add(1)
	go p.wait()
	return p, nil
}

// wait learns the exit from the daemon: the output files are complete
// (closed by the daemon) before it answers.
func (p *Process) wait() {
	defer p.wg.Done()
	exit, err := p.c.Wait(p.ctx, p.h.ID)
	switch {
	case p.ctx.Err() != nil && err != nil:
		// Let go of (Detach) or stopped: the exit is not ours to learn.
		if !errors.Is(err, procd.ErrTerminated) {
			return
		}
		p.exitErr = errors.New("daemonproc: terminated")
	case err != nil:
		p.exitErr = fmt.Errorf("daemonproc: waiting for the process: %w", err)
	case exit.Signal != "":
		p.exitErr = fmt.Errorf("daemonproc: killed by SIG%s", exit.Signal)
	case exit.Code != 0:
		p.exitErr = fmt.Errorf("daemonproc: exit status %d", exit.Code)
	}
	close(p.exited)
}

// Handle names the process for a later Attach.
func (p *Process) Handle() Handle { return p.h }

// ID is the daemon's id of the process.
func (p *Process) ID() string { return p.h.ID }

func (p *Process) Stdin() io.WriteCloser   { return p.stdin }
func (p *Process) Stdout() io.Reader       { return p.out }
func (p *Process) Stderr() io.Reader       { return p.errOut }
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitErr is nil for status 0.
func (p *Process) ExitErr() error {
	select {
	case <-p.exited:
		return p.exitErr
	default:
		return nil
	}
}

// Detach lets go of the process and leaves it running: Stdin's Close and
// Stop no longer reach the daemon, and the readers end.
func (p *Process) Detach() {
	p.detached.Store(true)
	p.cancel()
	p.CloseOutput()
	p.wg.Wait()
}

// Stop ends the process and everything it started through the daemon's
// terminate (custody's Close of the whole tree: stdin closed, grace,
// TERM, KILL), keeps the receipt, and removes the output files. After
// Detach it only releases this host's side. Idempotent.
func (p *Process) Stop(ctx context.Context) error {
	p.stopOnce.Do(func() {
		if p.detached.Load() {
			p.cancel()
			p.CloseOutput()
			p.wg.Wait()
			return
		}
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, StopTimeout)
			defer cancel()
		}
		r, err := p.c.Terminate(ctx, p.h.ID)
		if err != nil && !errors.Is(err, procd.ErrNotFound) {
			p.stopErr = fmt.Errorf("daemonproc: terminate: %w", err)
		}
		p.mu.Lock()
		p.receipt = r
		p.mu.Unlock()
		// The daemon answers waiters once the record is gone; give the
		// exit a moment to arrive before giving up on it.
		t := time.NewTimer(exitAfterStop)
		select {
		case <-p.exited:
		case <-t.C:
		}
		t.Stop()
		p.cancel()
		p.wg.Wait()
		if p.stopErr == nil {
			_ = os.Remove(p.h.Output)
			_ = os.Remove(p.h.Stderr)
		}
	})
	return p.stopErr
}

// Receipt is the custody receipt of Stop's terminate (nil before, after
// Detach, or when the daemon had no record left).
func (p *Process) Receipt() *custody.Receipt {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.receipt
}

// CloseOutput ends the stdout and stderr readers.
func (p *Process) CloseOutput() {
	p.out.Close()
	p.errOut.Close()
}

// stdin writes to the process's stdin through the daemon, one request per
// Write (the RPC client writes whole frames).
type stdin struct {
	p      *Process
	closed atomic.Bool
}

func (s *stdin) Write(b []byte) (int, error) {
	if s.closed.Load() || s.p.ctx.Err() != nil {
		return 0, os.ErrClosed
	}
	ctx, cancel := context.WithTimeout(s.p.ctx, WriteTimeout)
	defer cancel()
	if err := s.p.c.Write(ctx, s.p.h.ID, b); err != nil {
		return 0, fmt.Errorf("daemonproc: write: %w", err)
	}
	return len(b), nil
}

// Close closes the process's stdin (EOF for the agent), unless the
// process was let go of.
func (s *stdin) Close() error {
	if s.closed.Swap(true) || s.p.detached.Load() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), WriteTimeout)
	defer cancel()
	err := s.p.c.CloseStdin(ctx, s.p.h.ID)
	if err != nil && !errors.Is(err, procd.ErrNotFound) {
		return fmt.Errorf("daemonproc: closing stdin: %w", err)
	}
	return nil
}
