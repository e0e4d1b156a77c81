package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"time"

	"github.com/agenthost/agenthost/acp"
	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/rpc"
	"github.com/spf13/cobra"
)

func newDoctorCmd(logger func() *slog.Logger) *cobra.Command {
	var timeout time.Duration
	var transport, model string
	var asJSON bool
	var agentEnv []string
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: "Show what is installed and whether each agent starts",
		Long: `Show what is installed and whether each agent starts on the built-in model.
The ACP agents (claude-agent-acp, codex-acp, copilot) are installed first when
they are missing (progress on stderr); --transport rpc checks omp and pi only.
Exits 1 when something is wrong.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if transport != "" && transport != transportRPC && transport != transportACP {
				return usageErr(fmt.Errorf("doctor: --transport %q: want rpc or acp (default both)", transport))
			}
			if err := agents.CheckEnvNames(agentEnv); err != nil {
				return usageErr(fmt.Errorf("doctor: --agent-env: %w", err))
			}
			rep := runDoctor(cmd.Context(), cmd.ErrOrStderr(), logger(), timeout, transport)
			agentEnvReport(rep, os.Environ(), model, agentEnv)
			if asJSON {
				if err := printJSON(cmd.OutOrStdout(), rep); err != nil {
					return err
				}
			} else {
				rep.print(cmd.OutOrStdout())
			}
			if rep.Problems > 0 {
				return &exitError{1, fmt.Errorf("doctor: %d problem(s); `make setup` installs the pinned agents", rep.Problems)}
			}
			return nil
		},
	}
	cmd.Flags().DurationVar(&timeout, "timeout", 60*time.Second, "how long each agent may take to start")
	cmd.Flags().StringVar(&transport, "transport", "", "check only the agents of this transport: rpc (omp, pi) or acp")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as one JSON object")
	cmd.Flags().StringVar(&model, "model", os.Getenv(serveEnv["model"]), "the model serve runs (provider/model): whose key variables agents get")
	cmd.Flags().StringSliceVar(&agentEnv, "agent-env", envList(os.Getenv(serveEnv["agent-env"])), "the names serve --agent-env passes")
	return cmd
}

// envList splits a comma-separated list of names ("" is none).
func envList(s string) []string {
	var out []string
	for _, name := range strings.Split(s, ",") {
		if name = strings.TrimSpace(name); name != "" {
			out = append(out, name)
		}
	}
	return out
}

// agentEnvReport says which variables of env an agent gets (names only, never values): on the
// built-in model (model "") and, with a model, the key variables of its provider.
func agentEnvReport(rep *doctorReport, env []string, model string, pass []string) {
	const section = "agent environment (names only; serve --agent-env passes more)"
	given, left := agents.EnvNames(env, agents.EnvOptions{Home: "(the room's)", Model: model, Pass: pass})
	rep.add(section, true, "an agent gets: %s, TMPDIR (the room's), plus its own settings", strings.Join(given, ", "))
	if model != "" {
		p, _, _ := strings.Cut(model, "/")
		var keys []string
		for _, k := range agents.ProviderKeys(p) {
			if _, ok := os.LookupEnv(k); !ok {
				k += " (not set here)"
			}
			keys = append(keys, k)
		}
		rep.add(section, true, "on --model %s, the key variables of %s: %s", model, p, strings.Join(keys, ", "))
	}
	if len(left) > 0 {
		rep.add(section, true, "never given to an agent: %s", strings.Join(left, ", "))
	}
}

// doctorReport is what doctor found, section by section.
type doctorReport struct {
	Problems int           `json:"problems"`
	Checks   []doctorCheck `json:"checks"`
}

type doctorCheck struct {
	Section string `json:"section"`
	OK      bool   `json:"ok"`
	Detail  string `json:"detail"`
}

func (r *doctorReport) add(section string, ok bool, format string, a ...any) {
	if !ok {
		r.Problems++
	}
	r.Checks = append(r.Checks, doctorCheck{Section: section, OK: ok, Detail: fmt.Sprintf(format, a...)})
}

// group puts each section's checks together, the sections in the order
// each was first added (a section may be added to out of order: the warm
// pool's acp lines come after the ACP agents are started).
func (r *doctorReport) group() {
	order := map[string]int{}
	for _, c := range r.Checks {
		if _, ok := order[c.Section]; !ok {
			order[c.Section] = len(order)
		}
	}
	slices.SortStableFunc(r.Checks, func(a, b doctorCheck) int { return order[a.Section] - order[b.Section] })
}

func (r *doctorReport) print(w io.Writer) {
	section := ""
	for _, c := range r.Checks {
		if c.Section != section {
			section = c.Section
			fmt.Fprintln(w, section+":")
		}
		mark := "ok      "
		if !c.OK {
			mark = "PROBLEM "
		}
		fmt.Fprintf(w, "  %s %s\n", mark, c.Detail)
	}
	if r.Problems > 0 {
		fmt.Fprintf(w, "\n%d problem(s). `make setup` installs the pinned agents.\n", r.Problems)
		return
	}
	fmt.Fprintln(w, "\nall good.")
}

// runDoctor checks the runtimes and starts each agent of transport ("":
// both), then the warm pool of each pooled agent that started (rpc: omp,
// pi; acp: codex, copilot); progress (an install of the ACP agents) goes
// to progress.
func runDoctor(ctx context.Context, progress io.Writer, log *slog.Logger, timeout time.Duration, transport string) *doctorReport {
	rep := &doctorReport{}
	const runtimes = "runtimes"
	if out, err := exec.CommandContext(ctx, "node", "--version").Output(); err != nil {
		rep.add(runtimes, false, "node is not on PATH: pi needs Node.js 20 or newer (install it, e.g. the nodejs package)")
	} else {
		rep.add(runtimes, true, "node %s", strings.TrimSpace(string(out)))
	}
	in, err := agents.Find()
	if err != nil {
		rep.add(runtimes, false, "%v", err)
		return rep
	}
	rep.add(runtimes, true, "tools folder %s", in.Dir)
	if v, err := in.BunVersion(); err != nil {
		rep.add(runtimes, false, "bun: %v", err)
	} else {
		rep.add(runtimes, true, "bun %s", v)
	}

	// Before the agents, whose starts may take the time there is.
	confinementReport(ctx, rep)

	const pools = "warm pool (serve --pool: an agent started in a slot, then bound to a new room)"
	bound := 0 // pools that bound a room
	if transport != transportACP {
		const section = "agents (spawn, then get_state answered, on the built-in model)"
		var started []agents.Kind // the pool is checked for these
		for _, k := range []agents.Kind{agents.OMP, agents.Pi} {
			v, err := in.Version(k)
			if err != nil {
				rep.add(section, false, "%s: %v", k, err)
				continue
			}
			d, proto, err := probe(ctx, log, k, timeout)
			if err != nil {
				rep.add(section, false, "%s %s does not start: %s", k, v, oneLine(err.Error()))
				continue
			}
			rep.add(section, true, "%-3s %-8s started in %v (protocol v%d)", k, v, d.Round(time.Millisecond), proto)
			started = append(started, k)
		}
		for _, k := range started {
			ready, bind, err := probePool(ctx, log, k, transportRPC, timeout)
			if err != nil {
				rep.add(pools, false, "%s: the pool does not start: %s", k, oneLine(err.Error()))
				continue
			}
			rep.add(pools, true, "%-3s ready in %v, bound to a room in %v", k, ready.Round(time.Millisecond), bind.Round(time.Millisecond))
			bound++
		}
	}
	if transport != transportRPC {
		bound += acpDoctor(ctx, rep, progress, log, in, timeout, pools)
	}
	if os.Geteuid() == 0 && bound > 0 {
		rep.add(pools, true, "as root, the pool's agents run as uids of their own (--agent-uids), each handed to the room it is bound to (as in the binds above)")
	}
	rep.group()
	return rep
}

// acpDoctor starts each ACP agent, then probes the warm pool of those
// started that the acp transport pools (codex, copilot), reporting them in
// section pools; it returns how many pools bound a room.
func acpDoctor(ctx context.Context, rep *doctorReport, progress io.Writer, log *slog.Logger, in *agents.Install, timeout time.Duration, pools string) int {
	const section = "ACP agents (spawn, then initialize answered, on the built-in model)"
	var started []agents.Kind // the pool is checked for codex and copilot of these
	if err := in.EnsureACP(ctx, progress); err != nil {
		rep.add(section, false, "%s", oneLine(err.Error()))
	}
	for _, k := range acpKinds {
		if _, ok := agents.ACPRecipes[k]; !ok {
			continue // no recipe for it in this build
		}
		v, err := in.Version(k)
		if err != nil {
			rep.add(section, false, "%s: %v", k, err)
			continue
		}
		r, err := probeACP(ctx, log, k, timeout)
		if err != nil {
			rep.add(section, false, "%s %s does not start over ACP: %s", k, v, oneLine(err.Error()))
			continue
		}
		rep.add(section, true, "%-7s %-8s initialize answered in %v (%s); %s", k, v, r.start.Round(time.Millisecond), r.info, r.closed)
		started = append(started, k)
	}
	bound := 0
	var cold []string
	for _, k := range started {
		if k != agents.Codex && k != agents.Copilot {
			cold = append(cold, string(k)+" acp")
			continue
		}
		ready, bind, err := probePool(ctx, log, k, transportACP, timeout)
		if err != nil {
			rep.add(pools, false, "%s: the pool does not start: %s", k, oneLine(err.Error()))
			continue
		}
		rep.add(pools, true, "%s ready in %v, bound to a room in %v", k, ready.Round(time.Millisecond), bind.Round(time.Millisecond))
		bound++
	}
	if len(cold) > 0 {
		rep.add(pools, true, "%s: not pooled: the acp transport's warm pool serves codex and copilot only; their rooms start cold", strings.Join(cold, ", "))
	}
	return bound
}

// confinementReport says what the kernel's Landlock lets --confine
// enforce, and runs the launcher on a probe shell in each mode this
// machine enforces (agents as the server's user; as root, agents as a uid
// of their own), reporting what the shell held: its uid, capabilities,
// no_new_privs, seccomp mode and the Landlock ABI. Without Landlock
// nothing is a problem (auto runs agents unconfined).
func confinementReport(ctx context.Context, rep *doctorReport) {
	const section = "confinement (serve and prompt --confine; Landlock)"
	abi := confine.KernelABI()
	if abi < 1 {
		rep.add(section, true, "the kernel has no Landlock: --confine auto runs agents unconfined (with a warning), --confine landlock refuses to start")
		return
	}
	rep.add(section, true, "kernel Landlock ABI %d; agenthost enforces up to ABI %d: %s", abi, confine.MaxABI, strings.Join(confine.Enforces(abi), "; "))
	rep.add(section, true, "--confine auto (the default) and landlock enforce this; off runs agents unconfined")
	c, err := confine.New(confine.Options{Mode: confine.ModeLandlock})
	if err != nil {
		rep.add(section, false, "the confinement launcher: %s", oneLine(err.Error()))
		return
	}
	root := os.Geteuid() == 0
	res, err := c.Probe(ctx, nil)
	switch {
	case err != nil:
		rep.add(section, false, "the confinement launcher: %s", oneLine(err.Error()))
		return
	case !res.Wrote:
		rep.add(section, false, "the confinement launcher: the shell could not write its workspace")
		return
	case !res.Denied:
		rep.add(section, false, "the confinement launcher: the shell read a file outside its workspace: the kernel does not enforce Landlock")
		return
	}
	rep.add(section, true, "launcher: a confined shell wrote its workspace and was denied another folder")
	probeLine(rep, section, fmt.Sprintf("agents as the server's user (uid %d)", os.Geteuid()), res, root, c.Report().ABI)
	if !root {
		rep.add(section, true, "not root: agents run as the server's user; its bounding set stays (moot under no_new_privs), and Landlock does not stop chmod or utime of the server's own files by path")
		return
	}
	u := &confine.User{UID: doctorAgentUID(), GID: doctorAgentUID()}
	res, err = c.Probe(ctx, u)
	if err != nil {
		rep.add(section, false, "launcher, agents as a uid of their own (serve --agent-uids): %s", oneLine(err.Error()))
		return
	}
	probeLine(rep, section, fmt.Sprintf("agents as a uid of their own (serve --agent-uids; probed as uid %d)", u.UID), res, root, c.Report().ABI)
}

// doctorAgentUID is the uid doctor probes an agent of its own uid as: the
// first past serve's default --agent-uids, in the same band no system
// hands out (see confine.DefaultAgentUIDs), yet not in the range itself:
// a server on this machine may hold any uid of its range for a room (the
// room's files are that uid's), and the probe must not run as a room's
// agent.
func doctorAgentUID() int { return confine.DefaultAgentUIDs.Last + 1 }

// probeLine reports what the probe shell held in one mode.
func probeLine(rep *doctorReport, section, mode string, res confine.ProbeResult, root bool, abi int) {
	problems := res.Problems(root)
	detail := fmt.Sprintf("launcher, %s: %s; Landlock ABI %d", mode, res, abi)
	if len(problems) > 0 {
		detail += ": " + strings.Join(problems, "; ")
	}
	rep.add(section, len(problems) == 0, "%s", detail)
}

// probe spawns the agent on the built-in model and times spawn → get_state
// answered (Start's handshake).
func probe(ctx context.Context, log *slog.Logger, k agents.Kind, timeout time.Duration) (time.Duration, int, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	spec, _, cleanup, err := agentSpec(ctx, log, string(k), "", nil)
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
	err = c.Close()
	_ = c.Wait(ctx)
	return d, proto, err
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
	r, _, cleanup, err := acpRecipe(ctx, log, string(k), "", "", nil, false)
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
	_ = c.Wait(ctx)
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
