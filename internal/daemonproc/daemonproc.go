// Package daemonproc runs RPC agents as pipe processes of the process
// daemon (package procd), so they outlive the host: stdin goes through the
// daemon's write request, stdout is read from the daemon's output file by
// offset, and a later host attaches to the same process at the offset its
// room recorded.
package daemonproc

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
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

// ErrDaemonGone is a process's exit error when the daemon that ran it
// ended (the process ended with it).
var ErrDaemonGone = errors.New("daemonproc: the process daemon ended, and the agent with it")

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
	// Launch fingerprints what the process was started with (see
	// Starter.Fingerprint): a later host attaches it only if it would
	// launch the same. "" (a handle of an older version) matches nothing.
	Launch string `json:"launch,omitempty"`
	// Confinement is what confines the process, as its starter reported
	// it (JSON, kept for a later host; daemonproc does not read it).
	Confinement string `json:"confinement,omitempty"`
	// Resources are the limits it runs under and how they hold, as its
	// starter reported them (JSON, as Confinement).
	Resources string `json:"resources,omitempty"`
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

// Runner runs processes in the daemon for one host: its client, and one
// inotify instance for every output file the host tails (see watcher;
// where there is none, the Runner polls the files).
// Close it after every Process it made was stopped or let go of.
type Runner struct {
	c *procd.Client
	w *watcher
}

// NewRunner returns a Runner over c.
func NewRunner(c *procd.Client) (*Runner, error) {
	if c == nil {
		return nil, errors.New("daemonproc: NewRunner needs a client")
	}
	return &Runner{c: c, w: newWatcher(true)}, nil
}

// Client is the daemon's client.
func (r *Runner) Client() *procd.Client { return r.c }

// Close releases the inotify instance (or stops polling); a Process still open then reads
// only what its file holds. Idempotent.
func (r *Runner) Close() error {
	r.w.close()
	return nil
}

// Starter is an rpc.Starter that starts each agent as a pipe process of
// the daemon, its output files in Dir.
type Starter struct {
	Runner *Runner
	// Dir holds the process's output files (created 0700 if missing).
	Dir string
	// Settings are launch settings the command line and environment do
	// not carry (what the agent reads from files at its start: its MCP
	// servers, its model's address); they count in the fingerprint.
	Settings any
	// Resume are the arguments that only choose the session to resume
	// (they end the argument list): left out of the fingerprint, since a
	// later host would resume whatever session the agent is in by then.
	Resume []string
	// Limits bound the process and what it starts, where the daemon can
	// (a daemon of protocol 10 on); left out of the fingerprint: they
	// change nothing the agent does, and new ones hold from its next
	// start.
	Limits custody.Limits
}

var _ rpc.Starter = (*Starter)(nil)

// spec is the create_pipe request for cmd (output paths aside).
func (s *Starter) spec(cmd *exec.Cmd) (procd.PipeSpec, error) {
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
			return procd.PipeSpec{}, fmt.Errorf("daemonproc: %w", err)
		}
		dir = abs
	}
	argv := append([]string{cmd.Path}, cmd.Args[1:]...)
	return procd.PipeSpec{Argv: argv, Cwd: dir, Env: env}, nil
}

// Fingerprint is what Start records in Handle.Launch for cmd: a hash of
// the whole create_pipe request (argv without the Resume arguments, the
// working directory, every other field) with the environment as far as
// the host set it (entries not inherited unchanged from this process's
// own), and the Settings. A field added to the request counts without a
// change here. Output paths and metadata (where, not what) do not count.
func (s *Starter) Fingerprint(cmd *exec.Cmd) (string, error) {
	spec, err := s.spec(cmd)
	if err != nil {
		return "", err
	}
	return s.fingerprint(spec), nil
}

func (s *Starter) fingerprint(spec procd.PipeSpec) string {
	if n, k := len(spec.Argv), len(s.Resume); k > 0 && n > k && slices.Equal(spec.Argv[n-k:], s.Resume) {
		spec.Argv = spec.Argv[:n-k]
	}
	own := map[string]bool{}
	for _, e := range os.Environ() {
		own[e] = true
	}
	var env []string
	for _, e := range spec.Env {
		if !own[e] {
			env = append(env, e)
		}
	}
	slices.Sort(env)
	spec.Env = env
	spec.OutputPath, spec.StderrPath, spec.Metadata, spec.Limits = "", "", nil, nil
	b, err := json.Marshal(struct {
		Spec     procd.PipeSpec `json:"spec"`
		Settings any            `json:"settings,omitempty"`
	}{spec, s.Settings})
	if err != nil {
		b = []byte(err.Error()) // unmarshalable settings match nothing but themselves
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// Start implements rpc.Starter: cmd's path, args, dir and environment
// (nil: this process's) go to create_pipe. A failure after the process
// was created ends it and removes its files.
func (s *Starter) Start(ctx context.Context, cmd *exec.Cmd) (rpc.Process, error) {
	if s.Runner == nil || !filepath.IsAbs(s.Dir) {
		return nil, errors.New("daemonproc: Starter needs a Runner and an absolute Dir")
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("daemonproc: %w", err)
	}
	spec, err := s.spec(cmd)
	if err != nil {
		return nil, err
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	base := filepath.Join(s.Dir, "agent-"+hex.EncodeToString(b[:]))
	spec.OutputPath, spec.StderrPath = base+".out", base+".err"
	if !s.Limits.IsZero() {
		l := s.Limits
		spec.Limits = &l
	}
	c := s.Runner.c
	info, err := c.CreatePipe(ctx, spec)
	if err != nil {
		removeFiles(spec.OutputPath, spec.StderrPath)
		return nil, fmt.Errorf("daemonproc: create_pipe: %w", err)
	}
	h := Handle{Instance: c.InstanceID(), ID: info.ID, Output: spec.OutputPath, Stderr: spec.StderrPath, Launch: s.fingerprint(spec)}
	p, err := s.Runner.open(h, 0, 0)
	if err != nil {
		s.Runner.Discard(h)
		return nil, err
	}
	p.limited = info.Limits != nil
	return p, nil
}

// Running checks that h names a running process of this daemon:
// ErrNotRunning when it has exited, the daemon does not know it, or it ran
// in another daemon.
func (r *Runner) Running(ctx context.Context, h Handle) error {
	c := r.c
	if h.Instance != c.InstanceID() {
		return fmt.Errorf("%w: %s was a process of daemon %s, this is %s", ErrNotRunning, h.ID, h.Instance, c.InstanceID())
	}
	info, err := c.Get(ctx, h.ID)
	if errors.Is(err, procd.ErrNotFound) {
		return fmt.Errorf("%w: %s", ErrNotRunning, h.ID)
	}
	if err != nil {
		return fmt.Errorf("daemonproc: get: %w", err)
	}
	if !info.Running {
		return fmt.Errorf("%w: %s exited", ErrNotRunning, h.ID)
	}
	if info.Pipe == nil || info.Pipe.OutputPath != h.Output {
		return fmt.Errorf("%w: %s is another process", ErrNotRunning, h.ID)
	}
	return nil
}

// Attach takes over the running process h, its stdout read from offset
// (its stderr from its current end). ErrNotRunning as Running.
func (r *Runner) Attach(ctx context.Context, h Handle, offset int64) (*Process, error) {
	if err := r.Running(ctx, h); err != nil {
		return nil, err
	}
	var errAt int64
	if fi, err := os.Stat(h.Stderr); err == nil {
		errAt = fi.Size()
	}
	return r.open(h, offset, errAt)
}

// Discard ends the process h names, if it is this daemon's and still
// there (its receipt goes to the daemon's log), and removes its output
// files: for a recorded agent that will not be attached (it exited, its
// daemon is gone, or it was started otherwise than this host would).
// Bounded by StopTimeout.
func (r *Runner) Discard(h Handle) {
	if h.Instance == r.c.InstanceID() && h.ID != "" {
		ctx, cancel := context.WithTimeout(context.Background(), StopTimeout)
		_, err := r.c.Terminate(ctx, h.ID)
		cancel()
		if err != nil && !errors.Is(err, procd.ErrNotFound) && !errors.Is(err, procd.ErrNoDaemon) {
			// Still running, perhaps: its files stay with it.
			return
		}
	}
	removeFiles(h.Output, h.Stderr)
}

func removeFiles(paths ...string) {
	for _, p := range paths {
		if p != "" {
			_ = os.Remove(p)
		}
	}
}

// Process is a pipe process of the daemon seen as an rpc.Process. Its
// stdout and stderr readers tail the output files, woken by their growth
// (the Runner's inotify instance) or by the process's exit, never by
// polling.
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
	// lost: the daemon ended under the process (set before exited closes).
	lost bool
	wg   sync.WaitGroup

	// Trim: the output offset the host committed, and a wake-up for the
	// goroutine that passes it on.
	trimTo   atomic.Int64
	trimKick chan struct{}

	detached atomic.Bool
	stopOnce sync.Once
	stopErr  error
	receipt  *custody.Receipt // under mu
	mu       sync.Mutex

	// limited: the daemon took the process's limits (Starter.Limits).
	limited bool
}

// Limited says whether the daemon started the process with the limits it
// was given (a daemon before protocol 10 takes none).
func (p *Process) Limited() bool { return p.limited }

// Usage reads what the process's custody scope in the daemon has used,
// then, with resetPeak, starts a new window for its peak memory.
func (p *Process) Usage(ctx context.Context, resetPeak bool) (custody.Usage, error) {
	return p.c.Usage(ctx, p.h.ID, resetPeak)
}

func (r *Runner) open(h Handle, outAt, errAt int64) (*Process, error) {
	ctx, cancel := context.WithCancel(context.Background())
	p := &Process{c: r.c, h: h, ctx: ctx, cancel: cancel, exited: make(chan struct{}), trimKick: make(chan struct{}, 1)}
	var err error
	if p.out, err = openTail(r.w, h.Output, outAt, p.exited); err != nil {
		cancel()
		return nil, err
	}
	if p.errOut, err = openTail(r.w, h.Stderr, errAt, p.exited); err != nil {
		p.out.Close()
		cancel()
		return nil, err
	}
	p.trimTo.Store(outAt)
	p.stdin = &stdin{p: p}
	p.wg.Add(2)
	go p.wait()
	go p.trimLoop(outAt)
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
	case errors.Is(err, procd.ErrNoDaemon):
		// The daemon is gone, and the process with it (its stdin and
		// stdout were the daemon's).
		p.lost = true
		p.exitErr = ErrDaemonGone
	case err != nil:
		p.exitErr = fmt.Errorf("daemonproc: waiting for the process: %w", err)
	case exit.Signal != "":
		p.exitErr = fmt.Errorf("daemonproc: killed by SIG%s", exit.Signal)
	case exit.Code != 0:
		p.exitErr = fmt.Errorf("daemonproc: exit status %d", exit.Code)
	}
	close(p.exited)
}

// TrimEvery is how much committed output gathers before the daemon is
// asked to release it (see Trim): an output file takes at most about this
// much disk beyond what its host has not committed yet.
const TrimEvery = 1 << 20

// Trim tells the process's daemon that the host will never read its
// output before offset again (it committed it: a later host attaches past
// it): once TrimEvery bytes gathered, their disk blocks are released, the
// file keeping its offsets (procd's trim); stderr up to what this host
// has read. It never blocks; a daemon that cannot release blocks (a file
// system without hole punching) is not asked again.
func (p *Process) Trim(offset int64) {
	for {
		cur := p.trimTo.Load()
		if offset <= cur {
			return
		}
		if p.trimTo.CompareAndSwap(cur, offset) {
			break
		}
	}
	select {
	case p.trimKick <- struct{}{}:
	default:
	}
}

// trimLoop passes Trim's offsets on to the daemon, one request at a time.
func (p *Process) trimLoop(done int64) {
	defer p.wg.Done()
	for {
		select {
		case <-p.trimKick:
		case <-p.ctx.Done():
			return
		case <-p.exited:
			return
		}
		// Never past what this host has read: only output handled can
		// have been committed.
		to := min(p.trimTo.Load(), p.out.pos.Load())
		if to-done < TrimEvery {
			continue
		}
		ctx, cancel := context.WithTimeout(p.ctx, WriteTimeout)
		err := p.c.Trim(ctx, p.h.ID, to, p.errOut.pos.Load())
		cancel()
		if errors.Is(err, procd.ErrFailed) || errors.Is(err, procd.ErrUnsupported) {
			return // no hole punching there: not asked again
		}
		if err == nil {
			done = to
		}
	}
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
		var r *custody.Receipt
		var err error
		if !(isClosed(p.exited) && p.lost) && p.h.Instance == p.c.InstanceID() {
			// (A process whose daemon is gone has nothing to terminate.)
			r, err = p.c.Terminate(ctx, p.h.ID)
		}
		if err != nil && !errors.Is(err, procd.ErrNotFound) && !errors.Is(err, procd.ErrNoDaemon) {
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
			removeFiles(p.h.Output, p.h.Stderr)
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
		if errors.Is(err, procd.ErrNoDaemon) {
			err = ErrDaemonGone
		}
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
	if err != nil && !errors.Is(err, procd.ErrNotFound) && !errors.Is(err, procd.ErrNoDaemon) {
		return fmt.Errorf("daemonproc: closing stdin: %w", err)
	}
	return nil
}
