package rpc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Spec describes an agent to spawn in RPC mode. Argv is the program and its
// leading arguments (e.g. bun and omp's cli.js); the other fields become
// flags both omp and pi understand. The agent is never run through a shell.
type Spec struct {
	Argv               []string
	Mode               string // default "rpc"; omp also has "rpc-ui"
	Model              string // "provider/model"
	Thinking           string
	AppendSystemPrompt string
	Tools              []string // allowlist; nil means the agent's default
	NoSession          bool
	SessionDir         string
	Extensions         []string // loaded with -e
	ExtraArgs          []string
	// Dir is the agent's working directory (its workspace).
	Dir string
	// Env is the agent's whole environment; nil inherits the host's.
	Env []string
	// Verbatim runs Argv exactly as given, adding no flags: for agents
	// other than omp and pi that speak the same protocol.
	Verbatim bool
}

// Args returns the full argument vector, Argv first.
func (s Spec) Args() []string {
	args := append([]string(nil), s.Argv...)
	if s.Verbatim {
		return args
	}
	mode := s.Mode
	if mode == "" {
		mode = "rpc"
	}
	args = append(args, "--mode", mode)
	if s.Model != "" {
		args = append(args, "--model", s.Model)
	}
	if s.Thinking != "" {
		args = append(args, "--thinking", s.Thinking)
	}
	if s.AppendSystemPrompt != "" {
		args = append(args, "--append-system-prompt", s.AppendSystemPrompt)
	}
	if s.Tools != nil {
		args = append(args, "--tools", strings.Join(s.Tools, ","))
	}
	if s.NoSession {
		args = append(args, "--no-session")
	}
	if s.SessionDir != "" {
		args = append(args, "--session-dir", s.SessionDir)
	}
	for _, e := range s.Extensions {
		args = append(args, "-e", e)
	}
	return append(args, s.ExtraArgs...)
}

// Command is the command Spawn starts for s (not started): Args, Dir and
// Env.
func (s Spec) Command() *exec.Cmd {
	args := s.Args()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Dir = s.Dir
	cmd.Env = s.Env
	return cmd
}

// Process is a started agent process as the client drives it. Custody
// supplies a stronger implementation; the default puts the agent in its own
// process group.
type Process interface {
	Stdin() io.WriteCloser
	Stdout() io.Reader
	Stderr() io.Reader
	// Exited is closed once the process has exited and been reaped.
	Exited() <-chan struct{}
	// ExitErr is the exit status once Exited is closed (nil for status 0).
	ExitErr() error
	// Stop ends the process and what it started after stdin was closed:
	// grace for a voluntary exit, then escalating signals. Idempotent.
	Stop(ctx context.Context) error
	// CloseOutput closes the host's read ends of stdout/stderr, so readers
	// blocked on a pipe a descendant still holds return.
	CloseOutput()
}

// Starter starts agent processes. Options for Spawn take one; nil means
// the built-in process-group starter.
type Starter interface {
	Start(ctx context.Context, cmd *exec.Cmd) (Process, error)
}

// SpawnOptions configure Spawn.
type SpawnOptions struct {
	Options
	// Starter starts the process; nil uses a process group per agent.
	Starter Starter
	// Grace is how long Close waits for the agent to exit on its own after
	// stdin closes, and again between SIGTERM and SIGKILL (default 1 s).
	Grace time.Duration
}

// exitStatusWait bounds how long the reader, at EOF, waits for the exit
// status to put into the ExitError.
const exitStatusWait = 500 * time.Millisecond

// waitExit waits up to d for p to exit and returns its exit status (nil
// for status 0 or when d passed first).
func waitExit(p Process, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.Exited():
		return p.ExitErr()
	case <-t.C:
		return nil
	}
}

// Spawn starts the agent described by spec and a client over its stdio,
// then Starts the client (ctx bounds start-up). On any failure the process
// is stopped before Spawn returns.
func Spawn(ctx context.Context, spec Spec, opts SpawnOptions) (*Client, error) {
	if len(spec.Argv) == 0 {
		return nil, errors.New("rpc: spawn: empty command")
	}
	if err := checkDir(spec.Dir); err != nil {
		return nil, err
	}
	args := spec.Args()
	cmd := spec.Command()
	starter := opts.Starter
	if starter == nil {
		starter = GroupStarter{Grace: opts.Grace}
	}
	p, err := starter.Start(ctx, cmd)
	if err != nil {
		return nil, fmt.Errorf("rpc: spawn %s: %w", args[0], err)
	}
	c := New(p.Stdout(), p.Stdin(), opts.Options)
	c.attachProcess(p)
	if err := c.Start(ctx); err != nil {
		c.discard()
		if t := strings.TrimSpace(c.Stderr()); t != "" && !strings.Contains(err.Error(), "stderr:") {
			return nil, fmt.Errorf("%w (stderr: %s)", err, trim(causeLine(t), 300))
		}
		return nil, err
	}
	return c, nil
}

// Attach starts a client over p, an agent process already running (set
// Options.Adopt to say where its stdout is read from), and owns p as if
// Spawn had started it: Close stops it. On failure p is stopped.
func Attach(ctx context.Context, p Process, opts SpawnOptions) (*Client, error) {
	c := New(p.Stdout(), p.Stdin(), opts.Options)
	c.attachProcess(p)
	if err := c.Start(ctx); err != nil {
		c.discard()
		return nil, err
	}
	return c, nil
}

// discard closes a client its caller never gets (a failed Spawn or
// Attach) and joins it: nobody else could. Its callbacks (Options.OnEvent,
// the UI handler) have seen their contexts end.
func (c *Client) discard() {
	_ = c.Close()
	_ = c.Wait(context.Background())
}

// checkDir names a bad working directory; exec would report it as the
// agent binary missing.
func checkDir(dir string) error {
	if dir == "" {
		return nil
	}
	fi, err := os.Stat(dir)
	if err == nil && !fi.IsDir() {
		err = &fs.PathError{Op: "chdir", Path: dir, Err: syscall.ENOTDIR}
	}
	if err != nil {
		return fmt.Errorf("rpc: spawn: the agent's working directory: %w", err)
	}
	return nil
}

// Process returns the agent process the client owns (nil when attached to
// a plain reader/writer). Its Stop is the client's to call, through Close.
func (c *Client) Process() Process { return c.owned }

// attachProcess makes the client own p: stderr is drained into a bounded
// tail, and Close stops p.
func (c *Client) attachProcess(p Process) {
	c.owned = p
	c.stder = newTailBuffer(DefaultStderrTail)
	out := &readActivity{r: c.r}
	c.r = out
	c.wg.Add(2)
	c.stderrWG.Add(1)
	go func() {
		defer c.wg.Done()
		defer c.stderrWG.Done()
		_, _ = io.Copy(c.stder, p.Stderr())
	}()
	go c.watchExit(p, out)
}

// exitReadGrace is how long, after the agent exited, the reader must have
// waited in one Read with nothing arriving before the client stops reading:
// a descendant that inherited stdout keeps the pipe open, and without this
// a crashed agent would look alive until the caller's deadline.
const exitReadGrace = 750 * time.Millisecond

// readActivity counts Reads on the agent's stdout: seq is odd while a Read
// is in progress, and changes whenever one starts or returns.
type readActivity struct {
	r   io.Reader
	seq atomic.Uint64
}

func (a *readActivity) Read(p []byte) (int, error) {
	a.seq.Add(1)
	defer a.seq.Add(1)
	return a.r.Read(p)
}

// watchExit ends the read side once the agent has exited and its stdout
// has gone quiet: frames still in the pipe are read first (a Read that
// returns data restarts the wait), then the pipe is cut, the reader sees
// the end, and waiters get the exit status and stderr tail.
func (c *Client) watchExit(p Process, out *readActivity) {
	defer c.wg.Done()
	select {
	case <-p.Exited():
	case <-c.done:
		return
	}
	t := time.NewTimer(exitReadGrace)
	defer t.Stop()
	for {
		before := out.seq.Load()
		select {
		case <-t.C:
		case <-c.done:
			return
		}
		if now := out.seq.Load(); now == before && now%2 == 1 {
			// One Read blocked for the whole grace: only a descendant
			// holds the pipe open.
			c.log.Debug("rpc: the agent exited but its stdout stays open; closing it")
			p.CloseOutput()
			return
		}
		t.Reset(exitReadGrace)
	}
}

// Close ends the client's transport: every waiter is released at once
// with ErrClosed, stdin is closed, an owned process gets its grace period
// and is then stopped with escalating signals and reaped, and the reader
// stops reading. It returns the process's stop error, if any.
//
// Close never waits for user code: listeners, error listeners, host tools
// and UI handlers may still be running when it returns (the contexts of
// host tools and UI handlers have ended), and events read before Close
// may still be on their way to listeners. Wait joins them. So Close is safe to call from any
// callback, directly or through another goroutine the callback waits for.
// Close is idempotent: every call returns the first one's result (a call
// made while the first is under way waits for it).
func (c *Client) Close() error {
	c.mu.Lock()
	first := !c.closeStarted
	c.closeStarted = true
	c.mu.Unlock()
	if first {
		c.shutdown()
	}
	<-c.closeDone
	return c.closeErr
}

// Wait waits until everything the client started has ended: the
// callbacks have returned, the events read before Close have been
// delivered (or dropped and counted, see Options.Backpressure), and every
// goroutine of the client is gone. It returns once Close has run and that
// is done, or with ctx's error first. Wait must not be called from a
// callback: it would wait for its own caller (as http.Server.Shutdown
// would from a handler).
func (c *Client) Wait(ctx context.Context) error {
	select {
	case <-c.joined:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("rpc: wait: %w", context.Cause(ctx))
	}
}

// shutdown does Close's work, once.
func (c *Client) shutdown() {
	defer close(c.closeDone)
	c.mu.Lock()
	c.closed = true
	if !c.started {
		// Start now refuses to begin: no reader will run.
		close(c.readDone)
	}
	c.mu.Unlock()
	// The host's own close, not an agent crash: waiters get ErrClosed.
	c.retire(ErrClosed)
	// Close stdin without the write lock: a write blocked on a full
	// pipe returns once the file is closed.
	werr := c.w.Close()
	if werr != nil && !errors.Is(werr, os.ErrClosed) {
		c.log.Debug("rpc: closing stdin", "err", werr)
	}
	if c.owned != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c.closeErr = c.owned.Stop(ctx)
		cancel()
		// The leader is gone; a descendant may still hold stdout. Give
		// the reader a moment to see EOF, then cut the pipe.
		if !c.readerQuiet(100 * time.Millisecond) {
			c.owned.CloseOutput()
		}
	} else if rc, ok := c.r.(io.Closer); ok {
		if !c.readerQuiet(100 * time.Millisecond) {
			_ = rc.Close()
		}
	}
	c.readerQuiet(-1)
	if c.owned != nil {
		// Let stderr drain its tail, but not wait on a descendant
		// that keeps it open; then release the pipe fds.
		waitGroupTimeout(&c.stderrWG, 100*time.Millisecond)
		c.owned.CloseOutput()
	}
	// The rest ends without Close: the dispatcher once the reader has
	// ended and what it queued is delivered, the callbacks when they
	// return. Wait joins it all.
	go func() {
		<-c.readDone
		close(c.quit)
		c.wg.Wait()
		close(c.joined)
	}()
}

// readerQuiet waits up to d (d < 0: without limit) until the reader has
// stopped reading: it ended, or it only waits for listeners to make room
// in a full backlog (Options.Backpressure), which is user code Close does
// not wait for. It reports whether it has.
func (c *Client) readerQuiet(d time.Duration) bool {
	var expired <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-c.readDone:
		return true
	case <-c.readerParked:
		return true
	case <-expired:
		return false
	}
}

func waitGroupTimeout(wg interface{ Wait() }, d time.Duration) bool {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}
