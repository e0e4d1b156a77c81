package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agentproc"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/rpc"
	"github.com/spf13/cobra"
)

type promptFlags struct {
	agent   string
	model   string
	json    bool
	timeout time.Duration
	cwd     string
	verbose bool
}

func newPromptCmd(logger func() *slog.Logger, verbose func() bool) *cobra.Command {
	var f promptFlags
	cmd := &cobra.Command{
		Use:   "prompt [flags] MESSAGE [-- COMMAND ARGS...]",
		Short: "Run one turn and print the final assistant text",
		Long: `Run one turn against an agent in RPC mode and print the final assistant text,
or with --json every frame received, one JSON object per line.

Without --model the agent runs on agenthost's built-in scripted model (no key
needed, nothing leaves the machine); with --model provider/model it uses the
agent's own configuration and credentials. After "--", COMMAND ARGS... is run
verbatim as an RPC agent instead of omp or pi, to smoke-test any agent that
speaks the protocol.

Exits 0 only for a turn that settled; otherwise one line on stderr and a
non-zero code (1 failed, 2 usage, 3 timed out).

The agent and everything it starts run in a custody scope: nothing is left
running afterwards. -v prints the custody receipt on stderr; --json ends with
it as a line {"type":"agenthost_receipt","receipt":{...}}.`,
		Args: cobra.MinimumNArgs(1),
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
	fl.StringVar(&f.agent, "agent", "omp", "agent to run: omp or pi")
	fl.StringVar(&f.model, "model", "", "provider/model to use (default: the built-in scripted model)")
	fl.BoolVar(&f.json, "json", false, "print every frame received as JSON lines")
	fl.DurationVar(&f.timeout, "timeout", 5*time.Minute, "give up on the turn after this long")
	fl.StringVar(&f.cwd, "cwd", "", "the agent's working directory (default: the current one)")
	return cmd
}

func runPrompt(ctx context.Context, stdout, stderr io.Writer, log *slog.Logger, f promptFlags, msg string, custom []string) (err error) {
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()

	spec, cleanup, err := agentSpec(ctx, log, f.agent, f.model, custom)
	if err != nil {
		return err
	}
	defer cleanup()
	if f.cwd != "" {
		spec.Dir = f.cwd
	}
	cust, err := custody.New(custody.Options{Logger: log})
	if err != nil {
		return err
	}
	defer func() {
		if cerr := cust.Close(); cerr != nil && err == nil {
			err = cerr
		}
	}()

	var out sync.Mutex
	opts := rpc.SpawnOptions{Options: rpc.Options{Logger: log}, Starter: agentproc.Starter{Custodian: cust}}
	c, err := rpc.Spawn(ctx, spec, opts)
	if err != nil {
		return classify(ctx, fmt.Errorf("starting the agent: %w", err))
	}
	defer c.Close()
	enc := json.NewEncoder(stdout)
	if f.json {
		c.On("", func(ev rpc.Event) {
			out.Lock()
			defer out.Unlock()
			_ = enc.Encode(ev)
		})
	}
	turn, err := c.Run(ctx, msg, nil)
	// Close before printing: every frame reaches --json output first, and
	// the receipt exists.
	if cerr := c.Close(); cerr != nil {
		log.Warn("closing the agent", "err", cerr)
		if err == nil {
			err = cerr
		}
	}
	if r := agentproc.Receipt(c); r != nil {
		if f.json {
			_ = enc.Encode(map[string]any{"type": "agenthost_receipt", "receipt": r})
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

func classify(ctx context.Context, err error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return &exitError{3, fmt.Errorf("timed out: %w", err)}
	}
	return &exitError{1, err}
}

func oneLine(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			return s[:i] + " …"
		}
	}
	return s
}

// agentSpec resolves what to run. Without a model it starts the built-in
// scripted model and a throwaway agent home pointing at it; cleanup stops
// both.
func agentSpec(ctx context.Context, log *slog.Logger, agent, model string, custom []string) (rpc.Spec, func(), error) {
	noop := func() {}
	if len(custom) > 0 {
		return rpc.Spec{Argv: custom, Verbatim: true}, noop, nil
	}
	kind := agents.Kind(agent)
	if kind != agents.OMP && kind != agents.Pi {
		return rpc.Spec{}, noop, &exitError{2, fmt.Errorf("unknown agent %q (omp or pi)", agent)}
	}
	in, err := agents.Find()
	if err != nil {
		return rpc.Spec{}, noop, err
	}
	argv, err := in.Argv(kind)
	if err != nil {
		return rpc.Spec{}, noop, err
	}
	spec := rpc.Spec{Argv: argv, Model: model}
	if model != "" {
		return spec, noop, nil
	}
	sim := modelsim.New(modelsim.Options{Logger: log})
	if err := sim.Start(ctx); err != nil {
		return rpc.Spec{}, noop, fmt.Errorf("starting the built-in model: %w", err)
	}
	home, err := os.MkdirTemp("", "agenthost-home-")
	if err != nil {
		sim.Close()
		return rpc.Spec{}, noop, err
	}
	cleanup := func() {
		sim.Close()
		os.RemoveAll(home)
	}
	env, err := agents.Home(home, kind, sim.URL())
	if err != nil {
		cleanup()
		return rpc.Spec{}, noop, err
	}
	spec.Env = env
	spec.Model = agents.ModelID
	return spec, cleanup, nil
}
