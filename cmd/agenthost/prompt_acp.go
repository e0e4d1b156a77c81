package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/agenthost/agenthost/acp"
	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
	"github.com/agenthost/agenthost/internal/startfail"
	sdk "github.com/coder/acp-go-sdk"
)

// The transports prompt and serve speak to agents.
const (
	transportRPC = "rpc"
	transportACP = "acp"
)

// acpKinds are the agents that run over ACP.
var acpKinds = []agents.Kind{agents.OMP, agents.Claude, agents.Codex, agents.Copilot}

func checkACPKind(agent string) error {
	if !slices.Contains(acpKinds, agents.Kind(agent)) {
		return &exitError{2, fmt.Errorf("unknown ACP agent %q (omp, claude, codex or copilot)", agent)}
	}
	return nil
}

// ensureACPAgent installs the ACP-only agents on first need (agent is one
// of them and they are missing), with progress on w. Ctrl-C bounds it, not
// --timeout, which is the turn's.
func ensureACPAgent(ctx context.Context, agent string, custom []string, w io.Writer) error {
	if len(custom) > 0 || !agents.ACPOnly(agents.Kind(agent)) {
		return nil
	}
	in, err := agents.Find()
	if err != nil {
		return err
	}
	return in.EnsureACP(ctx, w)
}

// acpRecipe resolves what to run over ACP: custom verbatim, or agent's
// recipe with a throwaway home on the built-in model (unless model names
// one); cleanup stops the model and removes the home.
func acpRecipe(ctx context.Context, log *slog.Logger, agent, model, cwd string, custom []string, confined bool) (agents.ACPRecipe, agentWhere, func(), error) {
	noop := func() {}
	if len(custom) > 0 {
		return agents.ACPRecipe{Argv: custom, Env: customEnv()}, agentWhere{}, noop, nil
	}
	if err := checkACPKind(agent); err != nil {
		return agents.ACPRecipe{}, agentWhere{}, noop, err
	}
	in, err := agents.Find()
	if err != nil {
		return agents.ACPRecipe{}, agentWhere{}, noop, err
	}
	home, err := os.MkdirTemp("", "agenthost-home-")
	if err != nil {
		return agents.ACPRecipe{}, agentWhere{}, noop, err
	}
	cleanup := func() { os.RemoveAll(home) }
	opts := agents.ACPOptions{Home: home, Workspace: cwd, Confined: confined, Model: model}
	if model == "" {
		sim := modelsim.New(modelsim.Options{Logger: log})
		if err := sim.Start(ctx); err != nil {
			cleanup()
			return agents.ACPRecipe{}, agentWhere{}, noop, fmt.Errorf("starting the built-in model: %w", err)
		}
		cleanup = func() {
			sim.Close()
			os.RemoveAll(home)
		}
		opts.ModelURL = sim.URL()
	}
	r, err := in.ACP(agents.Kind(agent), opts)
	if err != nil {
		cleanup()
		return agents.ACPRecipe{}, agentWhere{}, noop, err
	}
	if model != "" {
		r.Model = model
	}
	return r, agentWhere{tools: in.Dir, home: home, modelURL: opts.ModelURL}, cleanup, nil
}

// runPromptACP is runPrompt over ACP: one session, one prompt. A
// permission request is denied (nobody is there to answer it).
func runPromptACP(ctx context.Context, stdout, stderr io.Writer, log *slog.Logger, f promptFlags, msg string, custom []string) (err error) {
	if err := ensureACPAgent(ctx, f.agent, custom, stderr); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	cwd := f.cwd
	if cwd == "" {
		if cwd, err = os.Getwd(); err != nil {
			return err
		}
	}
	if cwd, err = filepath.Abs(cwd); err != nil {
		return err
	}
	r, where, cleanup, err := acpRecipe(ctx, log, f.agent, f.model, cwd, custom, f.confine.enforced())
	if err != nil {
		return err
	}
	defer cleanup()
	command := r.Argv
	unconfine, pol, err := f.confine.wrap(log, where, cwd, &r.Argv, &r.Env)
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
	// One turn and done: after --timeout the agent gets a second to end
	// the turn on session/cancel, not acp's 5 s, before custody ends it.
	opts := acp.Options{Custodian: cust, FSRoot: cwd, Logger: log, CancelTimeout: time.Second}
	var jw *lineWriter
	if f.json {
		jw = newLineWriter(stdout)
		opts.Events = func(ev acp.Event) { jw.put(ctx, acpEventJSON(ev)) }
		defer func() {
			if !jw.close(ctx) && err == nil {
				err = &exitError{3, errors.New("timed out writing the --json output")}
			}
		}()
	}
	dir := cwd
	if r.Dir != "" {
		dir = r.Dir
	}
	c, err := acp.Start(ctx, acp.Spec{Argv: r.Argv, Dir: dir, Env: r.Env}, opts)
	if err != nil {
		var exit *acp.ExitError
		tail := ""
		if errors.As(err, &exit) {
			tail = exit.Stderr
		}
		err = startfail.Explain(fmt.Errorf("starting the agent: %w", err), tail,
			startfail.Info{Command: command, Custom: len(custom) > 0, Policy: pol, Allow: "prompt --confine-read"})
		printStartTail(ctx, log, stderr, err)
		return classify(ctx, err)
	}
	res, err := acpTurn(ctx, c, r, cwd, msg, f.model != "")
	if f.json && err == nil {
		jw.put(ctx, map[string]any{"type": "agenthost_turn", "stopReason": res.StopReason})
	}
	// Close before printing: the receipt exists, every event was written.
	cctx, ccancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	rc, cerr := c.Close(cctx)
	if cerr == nil {
		_ = c.Wait(cctx)
	}
	ccancel()
	if cerr != nil {
		log.Warn("closing the agent", "err", cerr)
		if err == nil {
			err = cerr
		}
	}
	if rc != nil {
		if f.json {
			jw.put(ctx, map[string]any{"type": "agenthost_receipt", "receipt": rc})
		}
		if f.verbose {
			fmt.Fprintln(stderr, rc)
		}
	}
	if err != nil {
		return classify(ctx, err)
	}
	switch res.StopReason {
	case sdk.StopReasonCancelled, sdk.StopReasonRefusal:
		return &exitError{1, fmt.Errorf("the turn ended without an answer: stop reason %s", res.StopReason)}
	}
	if !f.json {
		fmt.Fprintln(stdout, res.Text)
	}
	return nil
}

// acpTurn opens a session and runs msg. A model the user named must be
// selectable; the recipe's default model is selected when the agent offers
// it (omp's home has only that one anyway).
func acpTurn(ctx context.Context, c *acp.Client, r agents.ACPRecipe, cwd, msg string, named bool) (acp.Result, error) {
	s, err := c.NewSession(ctx, cwd, nil)
	if err != nil {
		return acp.Result{}, err
	}
	if r.Mode != "" {
		if err := c.SetMode(ctx, s.ID, r.Mode); err != nil {
			return acp.Result{}, err
		}
	}
	if r.Model != "" {
		if err := c.SelectModel(ctx, s, r.Model); err != nil && (named || !errors.Is(err, acp.ErrNotOffered)) {
			return acp.Result{}, err
		}
	}
	return c.Prompt(ctx, s.ID, msg)
}

// acpEventJSON is one --json line for an event: the update as the agent
// sent it, or what was wrong with a dropped line.
func acpEventJSON(ev acp.Event) any {
	if ev.Type == acp.TypeMalformed {
		return map[string]any{"type": "agenthost_malformed", "error": ev.Err.Error()}
	}
	return map[string]any{"type": "session/update", "sessionId": ev.SessionID, "update": json.RawMessage(ev.Raw)}
}
