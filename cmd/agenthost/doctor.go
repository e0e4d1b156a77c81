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
		v, err := in.Version(k)
		if err != nil {
			bad("%s: %v", k, err)
			continue
		}
		r, err := probeACP(ctx, log, k, timeout)
		if err != nil {
			bad("%s %s does not start over ACP: %v", k, v, err)
			continue
		}
		ok("%-7s %-8s initialize answered in %v (%s); %s", k, v, r.start.Round(time.Millisecond), r.info, r.closed)
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

// acpProbe is what probeACP measured.
type acpProbe struct {
	start  time.Duration // spawn → initialize answered
	info   string        // the agent's name and version, protocol, whether it loads sessions
	closed string        // how the agent ended after stdin EOF, and its receipt
}

// probeACP starts agent k over ACP on the built-in model, times spawn → initialize answered,
// then closes it and says how it ended.
func probeACP(ctx context.Context, log *slog.Logger, k agents.Kind, timeout time.Duration) (acpProbe, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	r, cleanup, err := acpRecipe(ctx, log, string(k), "", nil)
	if err != nil {
		return acpProbe{}, err
	}
	defer cleanup()
	cust, err := custody.New(custody.Options{Logger: log})
	if err != nil {
		return acpProbe{}, err
	}
	defer cust.Close()
	t0 := time.Now()
	c, err := acp.Start(ctx, acp.Spec{Argv: r.Argv, Env: r.Env}, acp.Options{Custodian: cust, Logger: log})
	if err != nil {
		return acpProbe{}, err
	}
	p := acpProbe{start: time.Since(t0)}
	in := c.Initialize()
	p.info = fmt.Sprintf("protocol v%d", in.ProtocolVersion)
	if in.AgentInfo != nil {
		p.info = in.AgentInfo.Name + " " + in.AgentInfo.Version + ", " + p.info
	}
	if in.AgentCapabilities.LoadSession {
		p.info += ", loadSession"
	}
	rec, err := c.Close(ctx)
	if err != nil {
		return p, fmt.Errorf("closing: %w", err)
	}
	if cl := c.Closure(); cl.StdoutEOF {
		p.closed = fmt.Sprintf("exited on stdin EOF in %v", cl.After.Round(time.Millisecond))
	} else {
		p.closed = "ended by custody after stdin EOF"
	}
	if rec != nil {
		ended := 0
		for _, e := range rec.Processes {
			if e.Ended == custody.EndedTerm || e.Ended == custody.EndedKill {
				ended++
			}
		}
		p.closed += fmt.Sprintf("; receipt: %d process(es), %d ended by custody", len(rec.Processes), ended)
	}
	return p, nil
}
