package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agentproc"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/startfail"
	"github.com/agenthost/agenthost/rpc"
	"github.com/spf13/cobra"
)

type promptFlags struct {
	transport string
	agent     string
	model     string
	json      bool
	timeout   time.Duration
	cwd       string
	verbose   bool
	confine   confineFlags
}

func newPromptCmd(logger func() *slog.Logger, verbose func() bool) *cobra.Command {
	var f promptFlags
	cmd := &cobra.Command{
		Use:   "prompt [flags] MESSAGE [-- COMMAND ARGS...]",
		Short: "Run one turn and print the final assistant text",
		Long: `Run one turn against an agent in RPC mode and print the final assistant text,
or with --json every frame received, one JSON object per line, from the
agent's first. With --transport acp the agent runs over the Agent Client
Protocol (omp acp, claude, codex, copilot, or any ACP command after "--"):
--json then prints every session/update as the agent sent it, a permission
request is denied (nobody is there to answer it), and fs requests are
confined to the working directory. A slow reader of the --json output slows the agent down
rather than failing the turn; --timeout still bounds everything.

Without --model the agent runs on agenthost's built-in scripted model (no key
needed, nothing leaves the machine); with --model provider/model it uses the
agent's own configuration and credentials. After "--", COMMAND ARGS... is run
verbatim as an RPC agent instead of omp or pi, to smoke-test any agent that
speaks the protocol.

Exits 0 only for a turn that settled; otherwise one line on stderr and a
non-zero code (1 failed, 2 usage, 3 timed out).

The agent and everything it starts run in a custody scope: nothing is left
running afterwards. Where the kernel has Landlock they are also confined
(--confine auto, the default): they read and write only the working
directory, the agent's home and a temporary folder of their own, and read
the system; --confine-net PORTS limits their TCP connects to those ports. -v prints the custody receipt on stderr; --json ends with
it as a line {"type":"agenthost_receipt","receipt":{...}}.`,
		Args: func(_ *cobra.Command, args []string) error {
			if len(args) == 0 {
				return &exitError{2, errors.New("prompt: give a MESSAGE (see --help)")}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			msg := args[0]
			var custom []string
			if dash := cmd.ArgsLenAtDash(); dash >= 0 {
				if dash != 1 {
					return &exitError{2, errors.New("prompt: give exactly one MESSAGE before --")}
				}
				custom = args[1:]
				if len(custom) == 0 {
					return &exitError{2, errors.New("prompt: -- must be followed by a command")}
				}
			} else if len(args) != 1 {
				return &exitError{2, errors.New("prompt: give exactly one MESSAGE (quote it)")}
			}
			f.verbose = verbose()
			return runPrompt(cmd.Context(), cmd.OutOrStdout(), cmd.ErrOrStderr(), logger(), f, msg, custom)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.transport, "transport", transportRPC, "wire protocol: rpc (omp, pi) or acp (omp, claude, codex, copilot)")
	fl.StringVar(&f.agent, "agent", "omp", "agent to run: omp or pi (rpc); omp, claude, codex or copilot (acp)")
	fl.StringVar(&f.model, "model", "", "provider/model to use (default: the built-in scripted model)")
	fl.BoolVar(&f.json, "json", false, "print every frame received as JSON lines")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Minute, "give up on the turn after this long")
	fl.StringVar(&f.cwd, "cwd", "", "the agent's working directory (default: the current one)")
	addConfineFlags(fl, &f.confine)
	return cmd
}

func runPrompt(ctx context.Context, stdout, stderr io.Writer, log *slog.Logger, f promptFlags, msg string, custom []string) (err error) {
	if f.cwd != "" {
		// exec would blame the agent's binary for a bad directory.
		fi, err := os.Stat(f.cwd)
		var pe *fs.PathError
		switch {
		case errors.As(err, &pe):
			return &exitError{2, fmt.Errorf("--cwd %s: %w", f.cwd, pe.Err)}
		case err != nil:
			return &exitError{2, fmt.Errorf("--cwd %s: %w", f.cwd, err)}
		case !fi.IsDir():
			return &exitError{2, fmt.Errorf("--cwd %s: not a directory", f.cwd)}
		}
	}
	if err := f.confine.check(); err != nil {
		return err
	}
	switch f.transport {
	case transportACP:
		return runPromptACP(ctx, stdout, stderr, log, f, msg, custom)
	case transportRPC:
	default:
		return &exitError{2, fmt.Errorf("--transport %q: want rpc or acp", f.transport)}
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()

	spec, where, cleanup, err := agentSpec(ctx, log, f.agent, f.model, custom)
	if err != nil {
		return err
	}
	defer cleanup()
	ws := f.cwd
	if where.startDir != "" {
		// omp starts in its own folder and is given the workspace (agents.OMPCwdArgs).
		if ws == "" {
			if ws, err = os.Getwd(); err != nil {
				return err
			}
		}
		if ws, err = filepath.Abs(ws); err != nil {
			return err
		}
		spec.Dir = where.startDir
		spec.ExtraArgs = append(spec.ExtraArgs, agents.OMPCwdArgs(ws)...)
	} else if f.cwd != "" {
		spec.Dir = f.cwd
	}
	command := spec.Argv
	unconfine, pol, err := f.confine.wrap(log, where, ws, &spec.Argv, &spec.Env)
	if err != nil {
		return err
	}
	defer unconfine()
	cust, err := custody.New(custody.Options{Logger: log})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := cust.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	// Only the turn's outcome is printed (--json streams the events as
	// they come): the turn keeps no copy of them.
	opts := rpc.SpawnOptions{Options: rpc.Options{Logger: log, RetainedTurnBytes: -1}, Starter: agentproc.Starter{Custodian: cust}}
	var jw *lineWriter
	if f.json {
		jw = newLineWriter(stdout)
		// Registered before the client starts: every frame, the start
		// handshake included.
		opts.OnEvent = func(ev rpc.Event) { jw.put(ctx, ev) }
		// A slow reader of our stdout slows the agent down through its
		// pipe instead of failing the turn; --timeout bounds it all.
		opts.Backpressure = true
		opts.StallTimeout = f.timeout
		defer func() {
			if !jw.close(ctx) && err == nil {
				err = &exitError{3, errors.New("timed out writing the --json output")}
			}
		}()
	}
	defer floodGC()()
	c, err := rpc.Spawn(ctx, spec, opts)
	if err != nil {
		var exit *rpc.ExitError
		tail := ""
		if errors.As(err, &exit) {
			tail = exit.Stderr
		}
		err = startfail.Explain(fmt.Errorf("starting the agent: %w", err), tail,
			startfail.Info{Command: command, Custom: len(custom) > 0, Policy: pol, Allow: "prompt --confine-read"})
		printStartTail(ctx, log, stderr, err)
		return classify(ctx, err)
	}
	defer c.Close()
	turn, err := c.Run(ctx, msg, nil)
	// Close and Wait before printing: every frame reaches --json output
	// first (the listener writes within ctx, so Wait ends with it), and
	// the receipt exists.
	cerr := c.Close()
	_ = c.Wait(context.WithoutCancel(ctx))
	if cerr != nil {
		log.Warn("closing the agent", "err", cerr)
		if err == nil {
			err = cerr
		}
	}
	if r := agentproc.Receipt(c); r != nil {
		if f.json {
			jw.put(ctx, map[string]any{"type": "agenthost_receipt", "receipt": r})
		}
		if f.verbose {
			fmt.Fprintln(stderr, r)
		}
	}
	if err != nil {
		return classify(ctx, err)
	}
	if turn.StopReason == rpc.StopReasonError || turn.StopReason == rpc.StopReasonAborted {
		reason := turn.ErrorMessage
		if reason == "" {
			reason = "stop reason " + turn.StopReason
		}
		return &exitError{1, fmt.Errorf("the turn ended without an answer: %s", oneLine(reason))}
	}
	if !f.json {
		fmt.Fprintln(stdout, turn.Text)
	}
	return nil
}

// floodGC sets the collector for a turn's stream and returns the restore.
// The client reads into a fresh buffer per pipe-full and drops it
// moments later, while prompt's live heap stays near nothing: at the
// default goal (4 MB) the collector ran about 85 times in a 200k-frame
// flood, a fifth of the process's CPU. A goal five times the live heap
// runs it a fifth as often; the soft memory limit keeps the worst case
// (a full backlog, a long line) about where the default goal had it.
// GOGC or GOMEMLIMIT in the environment win.
func floodGC() (restore func()) {
	if os.Getenv("GOGC") != "" || os.Getenv("GOMEMLIMIT") != "" {
		return func() {}
	}
	limit := debug.SetMemoryLimit(256 << 20)
	percent := debug.SetGCPercent(400)
	return func() {
		debug.SetGCPercent(percent)
		debug.SetMemoryLimit(limit)
	}
}

// lineWriter writes JSON lines to out from its own goroutine, one at a
// time: the listener waits for it (backpressure), but only as long as the
// turn's context, so a reader of out that never reads cannot hold the
// client's Close past --timeout.
type lineWriter struct {
	lines chan []byte
	done  chan struct{}
}

func newLineWriter(out io.Writer) *lineWriter {
	w := &lineWriter{lines: make(chan []byte), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		var err error
		for l := range w.lines {
			if err == nil {
				_, err = out.Write(l) // after an error (the reader left) lines are discarded
			}
		}
	}()
	return w
}

// put hands v over as one line, waiting for the writer while ctx lasts.
func (w *lineWriter) put(ctx context.Context, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return
	}
	select {
	case w.lines <- append(b, '\n'):
	case <-ctx.Done():
	}
}

// close ends the output and waits for the writer while ctx lasts; false
// means lines may be missing. After false the writer may still be blocked
// on out; it ends when out is closed (the process exits).
func (w *lineWriter) close(ctx context.Context) bool {
	close(w.lines)
	select {
	case <-w.done:
		return true
	case <-ctx.Done():
		return false
	}
}

func classify(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &exitError{3, fmt.Errorf("timed out: %w", err)}
	}
	return &exitError{1, err}
}

// unknownRPCAgent says an agent is not one the RPC transport runs, and
// for an ACP agent (claude, codex, copilot) the flag that runs it.
func unknownRPCAgent(agent string) error {
	if agents.ACPOnly(agents.Kind(agent)) {
		return fmt.Errorf("agent %q runs over ACP: add --transport acp (over RPC: omp or pi)", agent)
	}
	return fmt.Errorf("unknown agent %q (omp or pi; claude, codex and copilot with --transport acp)", agent)
}

// printStartTail writes, with -v, the last lines of the agent's stderr that
// err (a start failure) keeps: the error itself is printed as one line.
func printStartTail(ctx context.Context, log *slog.Logger, w io.Writer, err error) {
	var sf *startfail.Error
	if !errors.As(err, &sf) || len(sf.Tail) == 0 || !log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	fmt.Fprintln(w, "agenthost: the agent's stderr ended with:")
	for _, l := range sf.Tail {
		fmt.Fprintln(w, "  "+l)
	}
}

// agentSpec resolves what to run. Without a model it starts the built-in
// scripted model and a throwaway agent home pointing at it; on a named one
// the throwaway home is seeded with a copy of the user's configuration
// (seedUserHome), never the user's own home, which a confined agent could
// otherwise plant code in for the user's next plain run. cleanup stops the
// model and removes the home. omp never takes the working directory's own
// MCP servers, modules, plugins or settings (as in rooms): a repository
// could run code through them.
func agentSpec(ctx context.Context, log *slog.Logger, agent, model string, custom []string) (rpc.Spec, agentWhere, func(), error) {
	noop := func() {}
	if len(custom) > 0 {
		return rpc.Spec{Argv: custom, Verbatim: true, Env: customEnv()}, agentWhere{}, noop, nil
	}
	kind := agents.Kind(agent)
	if kind != agents.OMP && kind != agents.Pi {
		return rpc.Spec{}, agentWhere{}, noop, &exitError{2, unknownRPCAgent(agent)}
	}
	in, err := agents.Find()
	if err != nil {
		return rpc.Spec{}, agentWhere{}, noop, err
	}
	argv, err := in.Argv(kind)
	if err != nil {
		return rpc.Spec{}, agentWhere{}, noop, err
	}
	spec := rpc.Spec{Argv: argv, Model: model}
	startDir := ""
	home, err := os.MkdirTemp("", "agenthost-home-")
	if err != nil {
		return rpc.Spec{}, agentWhere{}, noop, err
	}
	cleanup := func() { os.RemoveAll(home) }
	if model != "" {
		if err := seedUserHome(home, kind); err != nil {
			cleanup()
			return rpc.Spec{}, agentWhere{}, noop, err
		}
	}
	if kind == agents.OMP {
		overlay, err := agents.WriteOMPOverlay(home, agents.OMPOverlay{BuiltinModel: model == ""})
		if err != nil {
			cleanup()
			return rpc.Spec{}, agentWhere{}, noop, err
		}
		// omp's own approval mode (nobody is there to answer an approval).
		spec.ExtraArgs = []string{"--config", overlay, "--no-extensions"}
		// omp's process starts in its own folder, the workspace given by --cwd (runPrompt).
		if startDir, err = in.OMPStartDir(); err != nil {
			cleanup()
			return rpc.Spec{}, agentWhere{}, noop, err
		}
	}
	if model != "" {
		if spec.Env, err = agents.NamedModelHome(home, kind, model, nil, nil); err != nil {
			cleanup()
			return rpc.Spec{}, agentWhere{}, noop, err
		}
		return spec, agentWhere{tools: in.Dir, home: home, startDir: startDir}, cleanup, nil
	}
	sim := modelsim.New(modelsim.Options{Logger: log})
	if err := sim.Start(ctx); err != nil {
		cleanup()
		return rpc.Spec{}, agentWhere{}, noop, fmt.Errorf("starting the built-in model: %w", err)
	}
	cleanup = func() {
		sim.Close()
		os.RemoveAll(home)
	}
	env, err := agents.Home(home, kind, sim.URL())
	if err != nil {
		cleanup()
		return rpc.Spec{}, agentWhere{}, noop, err
	}
	spec.Env = env
	spec.Model = agents.ModelID
	return spec, agentWhere{tools: in.Dir, home: home, modelURL: sim.URL(), startDir: startDir}, cleanup, nil
}

// customEnv is a custom command's environment (prompt -- COMMAND): agents.Env's, with the
// user's HOME.
func customEnv() []string {
	home, _ := os.UserHomeDir()
	return agents.Env(os.Environ(), agents.EnvOptions{Home: home})
}
