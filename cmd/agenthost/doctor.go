package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os/exec"
	"strings"
	"time"

	"github.com/agenthost/agenthost/acp"
	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/rpc"
	"github.com/spf13/cobra"
)

func newDoctorCmd(logger func() *slog.Logger) *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Show what is installed and whether each agent starts",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runDoctor(cmd.Context(), cmd.OutOrStdout(), logger(), timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 60*time.Second, "how long each agent may take to start")
	return cmd
}

func runDoctor(ctx context.Context, w io.Writer, log *slog.Logger, timeout time.Duration) error {
	problems := 0
	bad := func(format string, a ...any) {
		problems++
		fmt.Fprintf(w, "  PROBLEM  "+format+"\n", a...)
	}
	ok := func(format string, a ...any) { fmt.Fprintf(w, "  ok       "+format+"\n", a...) }

	fmt.Fprintln(w, "runtimes:")
	if out, err := exec.CommandContext(ctx, "node", "--version").Output(); err != nil {
		bad("node is not on PATH: pi needs Node.js 20 or newer (install it, e.g. the nodejs package)")
	} else {
		ok("node %s", strings.TrimSpace(string(out)))
	}
	in, err := agents.Find()
	if err != nil {
		bad("%v", err)
		fmt.Fprintf(w, "\n%d problem(s). Run `make setup` in the agenthost checkout.\n", problems)
		return &exitError{1, fmt.Errorf("doctor: %d problem(s)", problems)}
	}
	fmt.Fprintf(w, "  ok       tools folder %s\n", in.Dir)
	if v, err := in.BunVersion(); err != nil {
		bad("bun: %v", err)
	} else {
		ok("bun %s", v)
	}

	fmt.Fprintln(w, "agents (spawn, then get_state answered, on the built-in model):")
	for _, k := range []agents.Kind{agents.OMP, agents.Pi} {
		v, err := in.Version(k)
		if err != nil {
			bad("%s: %v", k, err)
			continue
		}
		d, proto, err := probe(ctx, log, k, timeout)
		if err != nil {
			bad("%s %s does not start: %v", k, v, err)
			continue
		}
		ok("%-3s %-8s started in %v (protocol v%d)", k, v, d.Round(time.Millisecond), proto)
	}
	fmt.Fprintln(w, "ACP agents (spawn, then initialize answered, on the built-in model):")
	for _, k := range acpKinds {
		if _, ok := agents.ACPRecipes[k]; !ok {
			continue // no recipe for it in this build
		}
		d, info, err := probeACP(ctx, log, k, timeout)
		if err != nil {
			bad("%s acp does not start: %v", k, err)
			continue
		}
		ok("%-7s %s started in %v (%s)", k, "acp", d.Round(time.Millisecond), info)
	}
	if problems > 0 {
		fmt.Fprintf(w, "\n%d problem(s). `make setup` installs the pinned agents.\n", problems)
		return &exitError{1, fmt.Errorf("doctor: %d problem(s)", problems)}
	}
	fmt.Fprintln(w, "\nall good.")
	return nil
}

// probe spawns the agent on the built-in model and times spawn → get_state
// answered (Start's handshake).
func probe(ctx context.Context, log *slog.Logger, k agents.Kind, timeout time.Duration) (time.Duration, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	spec, cleanup, err := agentSpec(ctx, log, string(k), "", nil)
	if err != nil {
		return 0, 0, err
	}
	defer cleanup()
	t0 := time.Now()
	c, err := rpc.Spawn(ctx, spec, rpc.SpawnOptions{Options: rpc.Options{Logger: log}})
	if err != nil {
		return 0, 0, err
	}
	d := time.Since(t0)
	proto := c.ProtocolVersion()
	return d, proto, c.Close()
}

// probeACP starts agent k over ACP on the built-in model and times spawn →
// initialize answered; info names the agent and what it can do.
func probeACP(ctx context.Context, log *slog.Logger, k agents.Kind, timeout time.Duration) (time.Duration, string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, cleanup, err := acpRecipe(ctx, log, string(k), "", nil)
	if err != nil {
		return 0, "", err
	}
	defer cleanup()
	cust, err := custody.New(custody.Options{Logger: log})
	if err != nil {
		return 0, "", err
	}
	defer cust.Close()
	t0 := time.Now()
	c, err := acp.Start(ctx, acp.Spec{Argv: r.Argv, Env: r.Env}, acp.Options{Custodian: cust, Logger: log})
	if err != nil {
		return 0, "", err
	}
	d := time.Since(t0)
	in := c.Initialize()
	info := fmt.Sprintf("protocol v%d", in.ProtocolVersion)
	if in.AgentInfo != nil {
		info = in.AgentInfo.Name + " " + in.AgentInfo.Version + ", " + info
	}
	if in.AgentCapabilities.LoadSession {
		info += ", loadSession"
	}
	_, err = c.Close(ctx)
	return d, info, err
}
