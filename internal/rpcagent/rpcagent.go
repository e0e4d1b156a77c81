// Package rpcagent is the room transport for agents in RPC mode (omp, pi,
// or any command speaking their protocol): each room's agent runs in a
// custody scope, in the room's workspace, with its own home and session
// directory, and its dialogs become the room's approvals and questions.
package rpcagent

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/agentfs"
	"github.com/agenthost/agenthost/internal/agentproc"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/daemonproc"
	"github.com/agenthost/agenthost/internal/detail"
	"github.com/agenthost/agenthost/internal/roomlimits"
	"github.com/agenthost/agenthost/internal/rpcagent/piext"
	"github.com/agenthost/agenthost/internal/slotpool"
	"github.com/agenthost/agenthost/internal/startfail"
	"github.com/agenthost/agenthost/internal/usage"
	"github.com/agenthost/agenthost/room"
	"github.com/agenthost/agenthost/rpc"
)

// Defaults for Options.
const (
	DefaultStartTimeout   = 90 * time.Second
	DefaultRefreshTimeout = 30 * time.Second
	// MaxDetail bounds tool input and output copied into room events.
	MaxDetail = 4 << 10
)

// Options configure a Transport.
type Options struct {
	// Custodian owns every agent process (required).
	Custodian *custody.Custodian
	// Daemon, when set, runs every agent as a pipe process of the process
	// daemon instead (its output files in the room's home), so that agents
	// outlive the host: the Transport is then a room.Attacher.
	Daemon *daemonproc.Runner
	// Install locates omp and pi (required unless every room runs a
	// custom command).
	Install *agents.Install
	// ModelURL, if set, points every agent home at that scripted model
	// (the built-in one) and selects it unless a room names a model.
	ModelURL string
	// StartTimeout bounds an agent's start and session checks (default
	// 90 s); RefreshTimeout the state refresh after a turn (default 30 s).
	StartTimeout, RefreshTimeout time.Duration
	// MaxLineBytes caps one line from the agent (0: rpc's default).
	MaxLineBytes int
	// Confine, if set, confines each agent to its room (nil: unconfined).
	Confine *confine.Confiner
	// AgentEnv are more variables every agent gets as the server has them
	// (serve --agent-env), beyond what agents.Env gives.
	AgentEnv []string
	// OTLP, if set, gives a room's agent the variables to export its own
	// spans (serve --otlp-agents; see agents.OTLPEnv).
	OTLP func(room string) []string
	// Pool, if set with a Size, keeps agents started ahead of their
	// rooms (see PoolOptions; StartPool starts it, Close ends it).
	Pool   *PoolOptions
	Logger *slog.Logger
}

// ErrNoMCP: the room configures MCP servers and its agent has no MCP
// client (pi); its agent does not start.
var ErrNoMCP = errors.New("rpcagent: the agent has no MCP client")

// Transport implements room.Transport over rpc, and room.Attacher when
// its agents run in the process daemon.
//
// Its warm pool's methods, StartPool, PoolStats, PoolWait, PoolHeld and
// PoolSignal, are slotpool.Methods' (the same for both transports; each
// does nothing, or says there is no pool, without Options.Pool).
type Transport struct {
	opts Options
	pool *pool // nil: no warm pool
	// StartPool, PoolStats, PoolWait, PoolHeld and PoolSignal: the warm
	// pool's (those of a transport without one when pool is nil).
	poolMethods
}

// poolMethods is embedded under this alias so that the field stays
// unexported: the transport's surface gains the methods only.
type poolMethods = slotpool.Methods[*poolAgent]

var _ room.Attacher = (*Transport)(nil)

// New returns a Transport.
func New(opts Options) (*Transport, error) {
	if opts.Custodian == nil {
		return nil, errors.New("rpcagent: Options.Custodian is required")
	}
	if opts.StartTimeout <= 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.RefreshTimeout <= 0 {
		opts.RefreshTimeout = DefaultRefreshTimeout
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	t := &Transport{opts: opts}
	if opts.Pool != nil && opts.Pool.Size > 0 {
		p, err := newPool(t, *opts.Pool)
		if err != nil {
			return nil, err
		}
		t.pool, t.poolMethods = p, p.Methods()
	}
	return t, nil
}

// Close ends the warm pool's idle agents (the rooms' agents are the
// rooms' to release).
func (t *Transport) Close() error {
	if t.pool != nil {
		t.pool.Close()
	}
	return nil
}

// maxWaitRuns bounds how many runs the agent started by itself a turn
// waits out before its prompt.
const maxWaitRuns = 8

// thinkingLevels are the thinking levels each agent takes: those its
// set_thinking_level keeps (another is cleared by omp, turned "off" by
// pi, and the start's check refuses the room's selection).
var thinkingLevels = map[agents.Kind][]string{
	agents.OMP: {rpc.ThinkingOff, rpc.ThinkingMinimal, rpc.ThinkingLow, rpc.ThinkingMedium, rpc.ThinkingHigh, rpc.ThinkingXHigh, rpc.ThinkingMax},
	agents.Pi:  {rpc.ThinkingOff, rpc.ThinkingMinimal, rpc.ThinkingLow, rpc.ThinkingMedium, rpc.ThinkingHigh, rpc.ThinkingXHigh},
}

var _ room.ThinkingLeveler = (*Transport)(nil)

// ThinkingLevels implements room.ThinkingLeveler ("" is omp, the
// default agent).
func (t *Transport) ThinkingLevels(agent string) []string {
	if agent == "" {
		agent = string(agents.OMP)
	}
	return thinkingLevels[agents.Kind(agent)]
}

// launch is how the transport starts spec's agent, the session to resume
// aside: the command, and the settings the agent reads from files at its
// start (for the daemon's launch fingerprint). It writes the agent's home
// (configuration, MCP servers, the overlay, pi's extension and room file),
// given to user (the room's, nil: the server's), through agentfs: a link
// the agent planted there is replaced or refused, never written through.
// It does at an attach too, where a running agent whose launch matches has
// read the same at its start, and one whose launch differs is not
// attached.
func (t *Transport) launch(spec room.AgentSpec, user *confine.User) (rs rpc.Spec, kind agents.Kind, settings launchSettings, err error) {
	cfg := spec.Config
	kind = agents.Kind(cfg.Agent)
	if kind == "" {
		kind = agents.OMP
	}
	owner := user.Owner()
	home, err := agentfs.Create(spec.Home, 0o700, owner)
	if err != nil {
		return rs, kind, settings, fmt.Errorf("rpcagent: the agent's home: %w", err)
	}
	defer home.Close()
	sessions := filepath.Join(spec.Home, sessionsDir)
	if err := home.MkdirAll(sessionsDir, 0o700); err != nil {
		return rs, kind, settings, fmt.Errorf("rpcagent: %w", err)
	}
	if len(cfg.Command) > 0 {
		env := agents.Env(os.Environ(), agents.EnvOptions{Home: spec.Home, Model: cfg.Model, Pass: t.opts.AgentEnv})
		rs = rpc.Spec{Argv: cfg.Command, Verbatim: true, Env: append(t.otlpEnv(env, spec.Room), cfg.Env...)}
		rs.Dir = spec.Workspace
		return rs, kind, settings, nil
	}
	if kind != agents.OMP && kind != agents.Pi {
		return rs, kind, settings, fmt.Errorf("rpcagent: unknown agent %q (omp or pi)", kind)
	}
	if t.opts.Install == nil {
		return rs, kind, settings, errors.New("rpcagent: no agent install (Options.Install)")
	}
	argv, err := t.opts.Install.Argv(kind)
	if err != nil {
		return rs, kind, settings, err
	}
	env, err := t.home(spec.Home, kind, cfg.Model, owner)
	if err != nil {
		return rs, kind, settings, err
	}
	settings.ModelURL = t.opts.ModelURL
	if kind == agents.Pi && t.addressSpaceLimited(cfg.Limits) {
		// RLIMIT_AS leaves no room for V8's Wasm guard regions: without
		// the flag pi's first fetch (the model's) fails at any limit.
		argv = slices.Insert(slices.Clone(argv), 1, agents.NodeNoWasmTrapHandler)
	}
	rs = rpc.Spec{Argv: argv, Model: cfg.Model, Thinking: cfg.Thinking, AppendSystemPrompt: cfg.Instructions,
		SessionDir: sessions, Env: append(t.otlpEnv(env, spec.Room), cfg.Env...)}
	if rs.Model == "" && t.opts.ModelURL != "" {
		rs.Model = agents.ModelID
	}
	if len(spec.MCP) == 0 && kind == agents.OMP {
		// A room whose servers were removed must not keep them; the
		// folders on the way are made real ones (a link there replaced),
		// so that the file omp would read is the one removed.
		err := home.MkdirAll(filepath.Dir(agents.OMPMCPFile), 0o700)
		if err == nil {
			err = home.Remove(agents.OMPMCPFile)
		}
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return rs, kind, settings, fmt.Errorf("rpcagent: %w", err)
		}
	}
	if len(spec.MCP) > 0 {
		if kind != agents.OMP {
			return rs, kind, settings, fmt.Errorf("%w: %s, and the room configures %d MCP server(s)", ErrNoMCP, kind, len(spec.MCP))
		}
		if err := writeMCP(home, spec.MCP); err != nil {
			return rs, kind, settings, err
		}
		settings.MCP = spec.MCP
	}
	if kind == agents.Pi {
		// pi has no approvals, questions or host tools: agenthost's
		// extension adds them, and pi reads nothing from the workspace.
		setup, pr, err := t.piSetup(spec, owner)
		if err != nil {
			return rs, kind, settings, err
		}
		rs.ExtraArgs = append(rs.ExtraArgs, setup.Args...)
		rs.Env = append(rs.Env, setup.Env...)
		settings.PiRoom = &pr
	}
	if kind == agents.OMP {
		// rpc-ui offers omp's ask tool; approvals as configured.
		rs.Mode = "rpc-ui"
		// What the workspace and the home would have omp load or run by itself (approvals,
		// MCP files, modules, plugins, settings, language servers, .env, bunfig.toml) is
		// not the room's: see agents.OMPWorkspaceArgs. The room's MCP servers come from the
		// home's one file the overlay opts in (agents.OMPMCPFile).
		o := agents.OMPOverlay{BuiltinModel: t.opts.ModelURL != "", MCP: len(spec.MCP) > 0, Ask: cfg.ApprovalMode != room.ApprovalYolo}
		overlay, err := agents.WriteOMPOverlayAs(spec.Home, o, owner)
		if err != nil {
			return rs, kind, settings, fmt.Errorf("rpcagent: %w", err)
		}
		settings.Overlay = agents.OMPOverlayText(o)
		rs.ExtraArgs = append(rs.ExtraArgs, agents.OMPWorkspaceArgs(cfg.ApprovalMode, overlay)...)
		rs.ExtraArgs = append(rs.ExtraArgs, agents.OMPCwdArgs(spec.Workspace)...)
		// omp's process starts in its package folder: Bun and omp read bunfig.toml and .env
		// from the process's folder before any flag (--cwd gives it the workspace).
		if rs.Dir, err = t.opts.Install.OMPStartDir(); err != nil {
			return rs, kind, settings, err
		}
		return rs, kind, settings, nil
	}
	rs.Dir = spec.Workspace
	return rs, kind, settings, nil
}

// addressSpaceLimited: the room's agent runs under RLIMIT_AS (custody's
// fallback where no cgroup limits memory, for a room with a memory limit).
func (t *Transport) addressSpaceLimited(l room.Limits) bool {
	return t.opts.Custodian != nil && l.Memory > 0 && t.opts.Custodian.Support().Memory == custody.ByRlimit
}

// launchSettings are what an agent reads from files at its start, beside
// its command line and environment: they count in the daemon's launch
// fingerprint, so an agent started with others is not attached.
type launchSettings struct {
	ModelURL string                    `json:"model_url,omitempty"`
	MCP      map[string]room.MCPServer `json:"mcp,omitempty"`
	Overlay  string                    `json:"overlay,omitempty"`
	// PiRoom is pi's room file: its approval mode and tools.
	PiRoom *piext.Room `json:"pi_room,omitempty"`
}

// Start implements room.Transport: a room whose settings match the warm
// pool's is given an agent of the pool when one is idle, and otherwise
// an agent started for it.
func (t *Transport) Start(ctx context.Context, spec room.AgentSpec) (room.Agent, error) {
	ctx, cancel := context.WithTimeout(ctx, t.opts.StartTimeout)
	defer cancel()
	spec.Tools = askFirst(spec.Tools, spec.Handler, spec.Config.ApprovalMode)
	if t.pool != nil {
		if a, ok, err := t.pool.take(ctx, spec); ok {
			return a, err
		}
	}
	return t.start(ctx, spec)
}

// start starts spec's agent (its tools already asking, see askFirst).
func (t *Transport) start(ctx context.Context, spec room.AgentSpec) (room.Agent, error) {
	cfg := spec.Config
	user, err := t.roomUser(spec)
	if err != nil {
		return nil, err
	}
	if err := t.prepareHome(spec, user.Owner()); err != nil {
		return nil, err
	}
	rs, kind, settings, err := t.launch(spec, user)
	if err != nil {
		return nil, err
	}
	custom := len(cfg.Command) > 0
	var resume []string
	if !custom && spec.SessionID != "" {
		file, err := resumeSession(spec.Home, spec.SessionID, user.Owner())
		if err != nil {
			return nil, err
		}
		// An absolute path: an id given where a path is expected
		// makes both agents create a junk session in the cwd.
		flag := "--resume"
		if kind == agents.Pi {
			flag = "--session"
		}
		resume = []string{flag, file}
		rs.ExtraArgs = append(rs.ExtraArgs, resume...)
	}
	a := &agent{refresh: t.opts.RefreshTimeout, log: t.opts.Logger}
	a.piext = kind == agents.Pi && !custom
	a.bindRoom(spec)
	command := rs.Argv
	pol, err := t.confine(spec, &rs, true, user)
	if err != nil {
		return nil, err
	}
	a.confined = room.Confinement(pol.Report())
	limits := roomlimits.Custody(cfg.Limits)
	a.res = roomlimits.Resources(t.opts.Custodian.Support(), cfg.Limits)
	opts := rpc.SpawnOptions{
		Options: rpc.Options{Logger: t.opts.Logger, UI: a.dialog, MaxLineBytes: cmp.Or(cfg.MaxLineBytes, t.opts.MaxLineBytes)},
		Starter: agentproc.Starter{Custodian: t.opts.Custodian, Limits: limits},
	}
	if t.opts.Daemon != nil {
		// The daemon's custodian is this host's kind (same machine, user
		// and groups): its support is this one's.
		opts.Starter = &daemonproc.Starter{Runner: t.opts.Daemon, Dir: outputDir(spec), Settings: settings, Resume: resume, Limits: limits}
	}
	c, err := rpc.Spawn(ctx, rs, opts)
	if err != nil {
		var exit *rpc.ExitError
		stderr := ""
		if errors.As(err, &exit) {
			stderr = exit.Stderr
		}
		return nil, startfail.Explain(fmt.Errorf("rpcagent: starting %s: %w", kind, err), stderr,
			startfail.Info{Command: command, Custom: custom, Policy: pol})
	}
	a.c = c
	a.live.Store(c)
	// The daemon's process is known before the listener runs: event reads
	// a.proc from the dispatcher's goroutine.
	if p, ok := c.Process().(*daemonproc.Process); ok {
		h := p.Handle()
		h.V2 = c.ProtocolVersion() == 2
		h.Ready = c.Ready() != nil
		b, _ := json.Marshal(a.confined)
		h.Confinement = string(b)
		if !p.Limited() && !cfg.Limits.IsZero() {
			a.res = room.Resources{Memory: int64(cfg.Limits.Memory), Pids: cfg.Limits.Pids, CPU: cfg.Limits.CPU,
				By:  room.ResourcesBy{Memory: string(custody.ByNothing), Pids: string(custody.ByNothing), CPU: string(custody.ByNothing)},
				Why: "the process daemon runs an older protocol (before 10) that takes no limits; they hold from its next start"}
		}
		b, _ = json.Marshal(a.res)
		h.Resources = string(b)
		a.proc, a.handle = p, h.String()
	}
	a.unsub = c.On("", a.event)
	if err := a.setup(ctx, c, spec, rs.Model, kind == agents.OMP && !custom); err != nil {
		return nil, err
	}
	return a, nil
}

// ErrLaunchChanged is Attach's error for an agent started otherwise than
// this transport would start it now (another agent, command, model,
// approval mode, environment, MCP servers, model address, or any other
// launch setting): it is ended, and the room starts a new one, resuming
// its session under the settings in force.
var ErrLaunchChanged = errors.New("rpcagent: the agent was started with other settings than this host's")

// Attach implements room.Attacher: it takes over an agent the daemon kept
// running across a restart of the host, reading its output from
// at.Offset on; with at.RunOpen the run in progress is Continue's. Only
// an agent whose recorded launch fingerprint is the one this transport
// would start it with now is attached (ErrLaunchChanged). An agent that
// is not attached is ended and its output files removed.
func (t *Transport) Attach(ctx context.Context, spec room.AgentSpec, at room.Attachment) (room.Detachable, error) {
	if t.opts.Daemon == nil {
		return nil, errors.New("rpcagent: no process daemon to attach agents from")
	}
	ctx, cancel := context.WithTimeout(ctx, t.opts.StartTimeout)
	defer cancel()
	spec.Tools = askFirst(spec.Tools, spec.Handler, spec.Config.ApprovalMode)
	h, err := daemonproc.ParseHandle(at.Handle)
	if err != nil {
		return nil, err
	}
	p, err := t.attachProc(ctx, spec, h, at.Offset)
	if err != nil {
		t.opts.Daemon.Discard(h)
		return nil, err
	}
	cfg := spec.Config
	kind := agents.Kind(cfg.Agent)
	if kind == "" {
		kind = agents.OMP
	}
	a := &agent{refresh: t.opts.RefreshTimeout, log: t.opts.Logger, proc: p, handle: at.Handle, attached: at.RunOpen,
		confined: attachedConfinement(h), res: attachedResources(h)}
	// The extension loaded at its start calls the room's tools.
	a.piext = kind == agents.Pi && len(cfg.Command) == 0
	a.bindRoom(spec)
	c, err := rpc.Attach(ctx, p, rpc.SpawnOptions{Options: rpc.Options{Logger: t.opts.Logger, UI: a.dialog,
		MaxLineBytes: cmp.Or(cfg.MaxLineBytes, t.opts.MaxLineBytes), OnEvent: a.event,
		Adopt: &rpc.Adopt{Offset: at.Offset, V2: h.V2, Ready: h.Ready, RunOpen: at.RunOpen}}})
	if err != nil {
		return nil, fmt.Errorf("rpcagent: attaching to the agent: %w", err)
	}
	a.c = c
	a.live.Store(c)
	a.unsub = func() {}
	model := cfg.Model
	if model == "" && t.opts.ModelURL != "" && len(cfg.Command) == 0 {
		model = agents.ModelID
	}
	if err := a.setup(ctx, c, spec, model, kind == agents.OMP && len(cfg.Command) == 0); err != nil {
		return nil, err
	}
	return a, nil
}

// attachProc attaches the daemon's process h if it runs and was launched
// as this transport would launch spec's agent now.
func (t *Transport) attachProc(ctx context.Context, spec room.AgentSpec, h daemonproc.Handle, offset int64) (*daemonproc.Process, error) {
	if err := t.opts.Daemon.Running(ctx, h); err != nil {
		return nil, err // gone: whatever it was started with
	}
	user, err := t.roomUser(spec)
	if err != nil {
		return nil, err
	}
	rs, _, settings, err := t.launch(spec, user)
	if err != nil {
		return nil, err
	}
	// The running agent's TMPDIR is kept: it is not started again.
	if _, err := t.confine(spec, &rs, false, user); err != nil {
		return nil, err
	}
	st := &daemonproc.Starter{Runner: t.opts.Daemon, Dir: outputDir(spec), Settings: settings}
	want, err := st.Fingerprint(rs.Command())
	if err != nil {
		return nil, err
	}
	if h.Launch != want {
		return nil, ErrLaunchChanged
	}
	return t.opts.Daemon.Attach(ctx, h, offset)
}

// setup reads the agent's session, checks its selection and registers the
// room's tools; on failure the client is closed.
func (a *agent) setup(ctx context.Context, c *rpc.Client, spec room.AgentSpec, model string, hostTools bool) error {
	cfg := spec.Config
	st, err := c.GetState(ctx)
	if err != nil {
		discard(c)
		return fmt.Errorf("rpcagent: reading the agent's state: %w", err)
	}
	a.session = st.SessionID
	if err := verifySelection(ctx, c, st, model, cfg.Thinking); err != nil {
		discard(c)
		return err
	}
	// Host tools are omp's (pi gets the room's tools from its extension);
	// a custom command may have none.
	if len(spec.Tools) > 0 && hostTools {
		if err := c.SetHostTools(ctx, toHostTools(spec.Tools)); err != nil {
			discard(c)
			return fmt.Errorf("rpcagent: registering the room's tools: %w", err)
		}
	}
	return nil
}

// piSetup writes agenthost's pi extension into the room's home with the
// room's approval mode and tools, given to owner.
func (t *Transport) piSetup(spec room.AgentSpec, owner *agentfs.Owner) (piext.Setup, piext.Room, error) {
	pkg, err := t.opts.Install.PackageDir(agents.Pi)
	if err != nil {
		return piext.Setup{}, piext.Room{}, err
	}
	tools := make([]piext.Tool, 0, len(spec.Tools))
	for _, tl := range spec.Tools {
		tools = append(tools, piext.Tool{Name: tl.Name, Description: tl.Description, Parameters: tl.Parameters})
	}
	pr := piext.Room{ApprovalMode: spec.Config.ApprovalMode, Tools: tools}
	setup, err := piext.WriteAs(spec.Home, pkg, pr, owner)
	if err != nil {
		return piext.Setup{}, pr, fmt.Errorf("rpcagent: %w", err)
	}
	return setup, pr, nil
}

func toHostTools(tools []room.Tool) []rpc.HostTool {
	out := make([]rpc.HostTool, 0, len(tools))
	for _, t := range tools {
		out = append(out, rpc.HostTool{
			Name: t.Name, Description: t.Description, Parameters: t.Parameters,
			Run: func(ctx context.Context, call *rpc.HostToolCall) (*rpc.HostToolResult, error) {
				text, err := t.Run(ctx, room.ToolCall{Args: call.Arguments})
				if err != nil {
					return nil, err
				}
				return rpc.TextResult(text), nil
			},
		})
	}
	return out
}

// writeMCP writes the room's MCP servers into its own omp agent dir (never
// the user's); the overlay keeps workspace files from adding others.
func writeMCP(home *agentfs.Dir, servers map[string]room.MCPServer) error {
	type entry struct {
		Type    string            `json:"type,omitempty"`
		Command string            `json:"command,omitempty"`
		Args    []string          `json:"args,omitempty"`
		Env     map[string]string `json:"env,omitempty"`
		URL     string            `json:"url,omitempty"`
		Headers map[string]string `json:"headers,omitempty"`
	}
	out := map[string]entry{}
	for name, s := range servers {
		e := entry{Env: s.Env, URL: s.URL, Headers: s.Headers}
		if len(s.Command) > 0 {
			e.Command, e.Args = s.Command[0], s.Command[1:]
		} else {
			e.Type = "http"
		}
		out[name] = e
	}
	b, err := json.MarshalIndent(map[string]any{"mcpServers": out}, "", "  ")
	if err != nil {
		return fmt.Errorf("rpcagent: %w", err)
	}
	if err := home.WriteFile(agents.OMPMCPFile, b, 0o600); err != nil {
		return fmt.Errorf("rpcagent: writing the room's MCP configuration: %w", err)
	}
	return nil
}

// home writes the room's agent home (given to owner) and returns the
// agent's environment (agents.Env's): pointed at the built-in model when
// there is one, and otherwise a home whose provider key (model's) comes in
// the environment.
func (t *Transport) home(dir string, kind agents.Kind, model string, owner *agentfs.Owner) ([]string, error) {
	if t.opts.ModelURL != "" {
		return agents.HomeWith(dir, kind, t.opts.ModelURL, agents.HomeOptions{Owner: owner, PassEnv: t.opts.AgentEnv})
	}
	return agents.NamedModelHome(dir, kind, model, t.opts.AgentEnv, owner)
}

// prepareHome makes the room's home safe for its agent's next start
// (agents.ResetHome, given to owner): before every start, never at an
// attach, where the agent runs on what it read at its start. A room that
// asks is refused a workspace whose omp plugins nothing switches off.
func (t *Transport) prepareHome(spec room.AgentSpec, owner *agentfs.Owner) error {
	cfg := spec.Config
	if len(cfg.Command) > 0 {
		return nil
	}
	kind := agents.Kind(cmp.Or(cfg.Agent, string(agents.OMP)))
	if kind == agents.OMP && cfg.ApprovalMode != room.ApprovalYolo {
		if err := agents.CheckOMPWorkspace(spec.Workspace, spec.Home); err != nil {
			return fmt.Errorf("rpcagent: %w", err)
		}
	}
	home, err := agentfs.Create(spec.Home, 0o700, owner)
	if err != nil {
		return fmt.Errorf("rpcagent: the agent's home: %w", err)
	}
	home.Close()
	return agents.ResetHome(spec.Home, kind, owner)
}

// sessionsDir is the agent's sessions folder in its home.
const sessionsDir = "sessions"

// resumeSession finds the session file of id in the home's sessions and
// repairs its tail (see repairTail), all through agentfs: a link or a
// special file named like a session file is never read (nor copied, nor
// written through); the result is the file's absolute path, for the
// agent's resume flag.
func resumeSession(homeDir, id string, owner *agentfs.Owner) (string, error) {
	home, err := agentfs.Open(homeDir, owner)
	if err != nil {
		return "", fmt.Errorf("rpcagent: the agent's home: %w", err)
	}
	defer home.Close()
	name, err := findSession(home, id)
	if err != nil {
		return "", err
	}
	if err := repairTail(home, name); err != nil {
		return "", err
	}
	return filepath.Join(homeDir, name), nil
}

// findSession returns the session file of id in the home's sessions
// (named "<time>_<id>.jsonl" by both agents; the last by name when there
// are several), or room.ErrSessionNotFound. Only regular files count: a
// link or a FIFO the agent put there is passed over.
func findSession(home *agentfs.Dir, id string) (string, error) {
	if strings.ContainsAny(id, "/\\*?[") || id == "" {
		return "", fmt.Errorf("%w: %q", room.ErrSessionNotFound, id)
	}
	m, err := home.Glob(filepath.Join(sessionsDir, "*_"+id+".jsonl"))
	if err != nil && !errors.Is(err, agentfs.ErrLink) {
		return "", fmt.Errorf("rpcagent: the agent's sessions: %w", err)
	}
	if len(m) == 0 {
		return "", fmt.Errorf("%w: no file for session %s", room.ErrSessionNotFound, id)
	}
	return m[len(m)-1], nil
}

// maxLastLine bounds the last line of a session file repairTail reads to
// tell whether it is whole: one longer is left alone.
const maxLastLine = 64 << 20

// repairTail drops a torn last line (a crash mid-write) from the session
// file name of home, keeping the original beside it (name.torn): pi
// appends onto a torn line and then loses the history before it. The
// file is read through agentfs (a regular file, not a link) and rewritten
// whole (a new file renamed over it).
func repairTail(home *agentfs.Dir, name string) error {
	f, err := home.OpenFile(name, os.O_RDONLY)
	if err != nil {
		return fmt.Errorf("rpcagent: session file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("rpcagent: session file: %w", err)
	}
	start, end, newline, err := lastLine(f, fi.Size())
	if err != nil || end-start > maxLastLine {
		return err
	}
	last := make([]byte, end-start)
	if _, err := f.ReadAt(last, start); err != nil {
		return fmt.Errorf("rpcagent: session file: %w", err)
	}
	switch {
	case fi.Size() == 0 || json.Valid(last) && newline:
		return nil
	case json.Valid(last):
		return appendNewline(home, name)
	}
	if err := home.WriteFrom(name+".torn", io.NewSectionReader(f, 0, fi.Size()), 0o600); err != nil {
		return fmt.Errorf("rpcagent: keeping the torn session file: %w", err)
	}
	if err := home.WriteFrom(name, io.NewSectionReader(f, 0, start), 0o600); err != nil {
		return fmt.Errorf("rpcagent: repairing the session file: %w", err)
	}
	return nil
}

// lastLine finds the last line of the file f of size bytes, trailing
// newlines aside: its bytes are [start, end), and newline says whether one
// follows it. A line longer than maxLastLine is reported from where the
// search stopped.
func lastLine(f io.ReaderAt, size int64) (start, end int64, newline bool, err error) {
	buf := make([]byte, 64<<10)
	end = -1 // until the last byte that is not a newline is found
	for pos := size; pos > 0; {
		n := min(int64(len(buf)), pos)
		pos -= n
		if _, err := f.ReadAt(buf[:n], pos); err != nil {
			return 0, 0, false, fmt.Errorf("rpcagent: session file: %w", err)
		}
		for i := n - 1; i >= 0; i-- {
			switch {
			case end < 0 && buf[i] != '\n':
				end = pos + i + 1
			case end >= 0 && buf[i] == '\n':
				return pos + i + 1, end, end < size, nil
			}
		}
		if end >= 0 && end-pos > maxLastLine {
			return pos, end, end < size, nil
		}
	}
	end = max(end, 0)
	return 0, end, end < size, nil
}

// appendNewline ends the session file name with a newline (appended to
// the regular file itself, never through a link).
func appendNewline(home *agentfs.Dir, name string) error {
	f, err := home.OpenFile(name, os.O_WRONLY|os.O_APPEND)
	if err != nil {
		return fmt.Errorf("rpcagent: session file: %w", err)
	}
	_, err = f.Write([]byte("\n"))
	return errors.Join(err, f.Close())
}

// roomUser is the user spec's agent runs as (nil: the server's; see
// confine.Confiner.RoomUser): the room's folder is its home's parent.
func (t *Transport) roomUser(spec room.AgentSpec) (*confine.User, error) {
	home, err := filepath.Abs(spec.Home)
	if err != nil {
		return nil, fmt.Errorf("rpcagent: %w", err)
	}
	if u, ok, err := t.slotUser(filepath.Dir(home)); ok {
		return u, err
	}
	u, err := t.opts.Confine.RoomUser(filepath.Dir(home))
	if err != nil {
		return nil, fmt.Errorf("rpcagent: the agent's user: %w", err)
	}
	return u, nil
}

// outputDir holds the output files of spec's agent in the process daemon:
// in the room's own folder beside its home, which the server owns and the
// agent cannot reach, so that the daemon (the server's user) never opens
// them through a link the agent planted, and the agent cannot read or
// forge them.
func outputDir(spec room.AgentSpec) string {
	home, err := filepath.Abs(spec.Home)
	if err != nil {
		home = spec.Home
	}
	return filepath.Join(filepath.Dir(home), "agent-output")
}

// verifySelection checks that the agent runs the model and thinking level
// the room asked for; set_thinking_level always succeeds, so only the
// state tells.
func verifySelection(ctx context.Context, c *rpc.Client, st *rpc.State, model, thinking string) error {
	if model != "" && st.Model != nil {
		if got := st.Model.Provider + "/" + st.Model.ID; got != model {
			return fmt.Errorf("%w: model %s, the agent runs %s", room.ErrSelectionRefused, model, got)
		}
	}
	if thinking != "" && st.ThinkingLevel != thinking {
		return fmt.Errorf("%w: thinking level %s, the agent runs %q", room.ErrSelectionRefused, thinking, st.ThinkingLevel)
	}
	return nil
}

// Confinement implements room.Confined: what confines the agents this
// Transport starts.
func (t *Transport) Confinement() room.Confinement { return room.Confinement(t.opts.Confine.Report()) }

// confine wraps rs's command in the room's confinement (as it is when
// agents run unconfined): what the agent may use (see confine.AgentRoom),
// its own command and its MCP servers' commands run, as user; fresh
// empties its TMPDIR (a start), else it is kept (the launch an attached
// agent is compared with, which must be the same as at its start).
func (t *Transport) confine(spec room.AgentSpec, rs *rpc.Spec, fresh bool, user *confine.User) (*confine.Policy, error) {
	exec := []string{rs.Argv[0]}
	for _, name := range slices.Sorted(maps.Keys(spec.MCP)) {
		if s := spec.MCP[name]; len(s.Command) > 0 {
			exec = append(exec, s.Command[0])
		}
	}
	r := confine.AgentRoom(spec.Workspace, spec.Home, exec, nil)
	r.FreshTmp = fresh
	r.Read = spec.ReadOnly
	r.User = user
	pol, err := t.opts.Confine.Policy(r)
	if err == nil {
		rs.Argv, rs.Env, err = pol.Wrap(rs.Argv, rs.Env)
	}
	if err != nil {
		return nil, fmt.Errorf("rpcagent: confining the agent: %w", err)
	}
	return pol, nil
}

// attachedConfinement is the confinement the agent was started with, as
// its handle records it (that of the host that started it).
func attachedConfinement(h daemonproc.Handle) room.Confinement {
	var c room.Confinement
	if json.Unmarshal([]byte(h.Confinement), &c) != nil {
		// Recorded by a host before confinement: it ran unconfined.
		var none *confine.Policy
		return room.Confinement(none.Report())
	}
	return c
}

// attachedResources are the limits the agent was started with, as its
// handle records them (that of the host that started it).
func attachedResources(h daemonproc.Handle) room.Resources {
	var r room.Resources
	if json.Unmarshal([]byte(h.Resources), &r) != nil {
		// Recorded by a host before limits: it runs with none.
		none := string(custody.ByNothing)
		return room.Resources{By: room.ResourcesBy{Memory: none, Pids: none, CPU: none},
			Why: "started by a server before limits; they hold from its next start"}
	}
	return r
}

// Resources implements room.Resourced: how the limits of the agents this
// Transport starts hold.
func (t *Transport) Resources() room.Resources {
	return roomlimits.Resources(t.opts.Custodian.Support(), room.Limits{})
}

// agent is one running RPC agent.
type agent struct {
	c       *rpc.Client
	session string
	// piext: the agent is pi with agenthost's extension, which calls the
	// room's tools through dialogs (omp's host tools the client runs).
	piext bool
	// b is the room the agent serves (set again once, at a pooled
	// agent's bind; read by the listeners and dialogs).
	b atomic.Pointer[binding]
	// pooled: the agent was started ahead of its room and bound to it
	// in bindTime; cleanup removes what the bind left (the slot's
	// folder), after the process is gone.
	pooled   bool
	bindTime time.Duration
	cleanup  func()
	// live is c once set, for dialogs that may come while it is being set
	// (an attached agent's requests are read again at once).
	live    atomic.Pointer[rpc.Client]
	refresh time.Duration
	unsub   func()
	mu      sync.Mutex
	acked   chan struct{} // closed once the current turn's prompt was answered
	// spent sums the current turn's usage from its assistant messages'
	// message_end frames (the listener adds, Run and Continue read);
	// badUsage counts reports it could not read.
	spent    usage.RPCTurn
	badUsage int
	log      *slog.Logger

	// confined is what confines the agent (room.Confined); res the
	// limits it runs under (room.Resourced).
	confined room.Confinement
	res      room.Resources

	// An agent in the process daemon: its process, handle (recorded by
	// the room), whether it was attached mid-run, whether it was let go
	// of; read is the output position past the last frame the listeners
	// saw.
	proc     *daemonproc.Process
	handle   string
	attached bool
	detached atomic.Bool
	read     atomic.Int64
}

// binding is the room side of an agent: its handler, and its tools (run
// through the pi extension's dialogs; roomTools are their names, which
// ask the room themselves, see askFirst: omp's own prompt for one is
// answered Approve).
type binding struct {
	h         room.Handler
	tools     []room.Tool
	roomTools map[string]bool
}

// bd is the agent's binding.
func (a *agent) bd() *binding { return a.b.Load() }

// bindRoom gives the agent spec's room.
func (a *agent) bindRoom(spec room.AgentSpec) {
	b := &binding{h: spec.Handler, roomTools: roomToolNames(spec.Tools)}
	if a.piext {
		b.tools = spec.Tools
	}
	if b.h == nil {
		b.h = unbound{}
	}
	a.b.Store(b)
}

// unbound is the handler of an agent no room holds yet: it records
// nothing and allows nothing.
type unbound struct{}

func (unbound) Event(room.AgentEvent)                                    {}
func (unbound) Approve(context.Context, room.ApprovalRequest) bool       { return false }
func (unbound) Ask(context.Context, room.QuestionRequest) (string, bool) { return "", false }

var (
	_ room.Detachable = (*agent)(nil)
	_ room.Committer  = (*agent)(nil)
	_ room.LeaseBound = (*agent)(nil)
	_ room.Metered    = (*agent)(nil)
	_ room.Resourced  = (*agent)(nil)
)

// Pooled implements room.Pooled: whether the agent was started ahead of
// its room (the warm pool), and how long its bind took.
func (a *agent) Pooled() (bool, time.Duration) { return a.pooled, a.bindTime }

// Confinement implements room.Confined.
func (a *agent) Confinement() room.Confinement { return a.confined }

// Resources implements room.Resourced.
func (a *agent) Resources() room.Resources { return a.res }

// Meter implements room.Metered: the agent's custody scope's usage, here
// or in the process daemon.
func (a *agent) Meter(ctx context.Context) (room.Meter, error) {
	if a.proc != nil {
		u, err := a.proc.Usage(ctx, false)
		return roomlimits.Meter(u), err
	}
	u, ok := agentproc.Usage(a.c)
	if !ok {
		return room.Meter{}, errors.New("rpcagent: the agent's process is not in custody here")
	}
	return roomlimits.Meter(u), nil
}

// ResetPeak implements room.Metered.
func (a *agent) ResetPeak(ctx context.Context) error {
	if a.proc != nil {
		_, err := a.proc.Usage(ctx, true)
		return err
	}
	return agentproc.ResetPeak(a.c)
}

// Handle implements room.Detachable ("" for an agent in custody here).
func (a *agent) Handle() string { return a.handle }

// Committed implements room.Committer: the daemon may release the
// agent's output before the room's resume offset.
func (a *agent) Committed(offset int64) {
	if a.proc != nil {
		a.proc.Trim(offset)
	}
}

// Detach implements room.Detachable: the client ends, the process runs on.
func (a *agent) Detach() error {
	if a.proc == nil {
		return errors.New("rpcagent: the agent does not run in the process daemon")
	}
	a.detached.Store(true)
	a.proc.Detach()
	discard(a.c)
	a.unsub()
	return nil
}

// joinWait bounds joining the callbacks of a client closed without a
// context of the caller's (the room's handlers return once their
// contexts end).
const joinWait = 10 * time.Second

// discard closes c and joins its callbacks: after it no listener of c
// reports anything more to the room.
func discard(c *rpc.Client) {
	_ = c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), joinWait)
	defer cancel()
	_ = c.Wait(ctx)
}

// Continue implements room.Detachable: it waits for the run that was in
// progress when the agent was attached.
func (a *agent) Continue(ctx context.Context) (room.TurnResult, error) {
	if !a.attached {
		return room.TurnResult{}, errors.New("rpcagent: no run to continue")
	}
	acked := make(chan struct{})
	close(acked) // the prompt was answered before the restart
	a.mu.Lock()
	// Only what the run sent after the attach is counted (the listener
	// has summed it since): the usage of its messages before the restart
	// was read by the previous host, and is lost with it.
	a.acked = acked
	a.mu.Unlock()
	turn, err := a.c.WaitTurn(ctx)
	if err == nil && !turn.AgentInvoked {
		// No run was in progress after all (the prompt never reached
		// the agent): the turn fails rather than settle with nothing.
		return room.TurnResult{}, errors.New("rpcagent: the agent had no run in progress when it was attached")
	}
	return a.finish(ctx, turn, err)
}

func (a *agent) SessionID() string { return a.session }

func (a *agent) Run(ctx context.Context, text string) (room.TurnResult, error) {
	acked := make(chan struct{})
	a.mu.Lock()
	a.acked = acked
	a.spent, a.badUsage = usage.RPCTurn{}, 0
	a.mu.Unlock()
	err := a.c.Prompt(ctx, text, nil)
	for tries := 0; errors.Is(err, rpc.ErrTurnInProgress) && tries < maxWaitRuns; tries++ {
		// omp ran something by itself (a background job finished): the
		// room's turn waits for that run, then prompts.
		if _, werr := a.c.WaitTurn(ctx); werr != nil && ctx.Err() != nil {
			break
		}
		err = a.c.Prompt(ctx, text, nil)
	}
	close(acked)
	if err != nil {
		return room.TurnResult{}, err
	}
	turn, err := a.c.WaitTurn(ctx)
	return a.finish(ctx, turn, err)
}

// finish judges a turn the client saw end (or not), with what it spent
// (whatever its outcome: a failed turn may have used tokens).
func (a *agent) finish(ctx context.Context, turn *rpc.Turn, err error) (room.TurnResult, error) {
	res, err := a.judge(ctx, turn, err)
	a.mu.Lock()
	res.Usage = a.spent.Usage()
	if a.badUsage > 0 {
		a.log.Warn("rpcagent: the agent sent usage reports that could not be read; the turn's usage leaves them out", "reports", a.badUsage)
	}
	a.mu.Unlock()
	return res, err
}

// judge is how a turn the client saw end (or not) ended.
func (a *agent) judge(ctx context.Context, turn *rpc.Turn, err error) (room.TurnResult, error) {
	if err == nil {
		// The listeners run behind the reader: let them see the turn's
		// last events before the room records its end.
		sctx, cancel := context.WithTimeout(ctx, a.refresh)
		_ = a.c.Sync(sctx)
		cancel()
	}
	if err != nil {
		if ctx.Err() != nil && !a.detached.Load() {
			// Stop the agent's work; the room retires it anyway.
			actx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = a.c.Abort(actx)
			cancel()
		}
		return room.TurnResult{}, err
	}
	switch turn.StopReason {
	case rpc.StopReasonError:
		return room.TurnResult{}, fmt.Errorf("the agent's turn failed: %s", firstLine(turn.ErrorMessage))
	case rpc.StopReasonAborted:
		return room.TurnResult{}, errors.New("the agent aborted the turn")
	}
	// Past the turn's last frame (the listeners have seen it, Sync):
	// recorded with the turn's end.
	offset := a.read.Load()
	// The post-turn refresh is bounded: when it fails the turn still
	// ends, marked uncertain.
	rctx, cancel := context.WithTimeout(ctx, a.refresh)
	defer cancel()
	_, serr := a.c.GetState(rctx)
	return room.TurnResult{Text: turn.Text, Uncertain: serr != nil, Offset: offset}, nil
}

// Steer and FollowUp wait until the running turn's prompt was
// acknowledged: sent before it, they would reach an idle agent, which
// queues them (pi) or starts a run of its own (omp).
func (a *agent) Steer(ctx context.Context, text string) error {
	if err := a.waitPrompted(ctx); err != nil {
		return err
	}
	return a.c.Steer(ctx, text, nil)
}

func (a *agent) FollowUp(ctx context.Context, text string) error {
	if err := a.waitPrompted(ctx); err != nil {
		return err
	}
	return a.c.FollowUp(ctx, text, nil)
}

func (a *agent) waitPrompted(ctx context.Context) error {
	a.mu.Lock()
	acked := a.acked
	a.mu.Unlock()
	if acked == nil {
		return errors.New("rpcagent: no turn to deliver into")
	}
	select {
	case <-acked:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-a.c.Done():
		return errors.New("rpcagent: the agent is gone")
	}
}

func (a *agent) Done() <-chan struct{} { return a.c.Done() }

// HoldUntil implements room.LeaseBound: the agent's custody scope is
// frozen at deadline (a cluster's lease).
func (a *agent) HoldUntil(deadline time.Time) error { return agentproc.HoldUntil(a.c, deadline) }

// Kill implements room.LeaseBound.
func (a *agent) Kill() error { return agentproc.Kill(a.c) }

func (a *agent) Close(ctx context.Context) (json.RawMessage, error) {
	err := a.c.Close()
	// Nothing of the agent reaches the room after its release.
	if werr := a.c.Wait(ctx); err == nil {
		err = werr
	}
	a.unsub()
	if a.cleanup != nil {
		a.cleanup()
	}
	var raw json.RawMessage
	if r := agentproc.Receipt(a.c); r != nil {
		raw, _ = json.Marshal(r)
	} else if a.proc != nil && a.proc.Receipt() != nil {
		raw, _ = json.Marshal(a.proc.Receipt())
	}
	return raw, err
}

// event normalises the agent's frames for the room, each with its
// position in the agent's output.
func (a *agent) event(ev rpc.Event) {
	end := ev.End()
	if a.proc != nil && end > a.read.Load() {
		a.read.Store(end) // the dispatcher is the only writer
	}
	if a.proc != nil && ev.IsDialog() {
		if a.piext && a.isToolCall(ev) {
			// A room tool's call, not a person's dialog: a new host does
			// not run it again (as omp's host tool calls).
			a.bd().h.Event(room.AgentEvent{Kind: room.KindActivity})
			return
		}
		a.bd().h.Event(room.AgentEvent{Kind: room.KindDialog, Start: ev.Start(), Offset: end})
		return
	}
	switch ev.Type {
	case rpc.EventMessageEnd:
		a.mu.Lock()
		if a.spent.Frame(ev.Raw()) != nil {
			a.badUsage++
		}
		a.mu.Unlock()
	case rpc.EventMessageUpdate:
		var u rpc.MessageUpdateEvent
		if ev.Decode(&u) == nil {
			if d, err := u.Update(); err == nil && d.Type == "text_delta" && d.Delta != "" {
				a.bd().h.Event(room.AgentEvent{Kind: room.KindText, Text: d.Delta, Offset: a.offset(end)})
				return
			}
		}
	case rpc.EventToolExecutionStart:
		var s rpc.ToolExecutionStartEvent
		if ev.Decode(&s) == nil {
			a.bd().h.Event(room.AgentEvent{Kind: room.KindToolStarted, Tool: detail.Name(s.ToolName), CallID: detail.Name(s.ToolCallID),
				Input: text(string(s.Args)), Offset: a.offset(end)})
			return
		}
	case rpc.EventToolExecutionEnd:
		var e rpc.ToolExecutionEndEvent
		if ev.Decode(&e) == nil {
			out := string(e.Result)
			if r, err := e.DecodeResult(); err == nil {
				out = r.Text()
			}
			a.bd().h.Event(room.AgentEvent{Kind: room.KindToolEnded, Tool: detail.Name(e.ToolName), CallID: detail.Name(e.ToolCallID),
				Output: text(out), IsError: e.IsError, Offset: a.offset(end)})
			return
		}
	}
	a.bd().h.Event(room.AgentEvent{Kind: room.KindActivity})
}

// offset is an event's position for the room: only an agent whose output
// outlives the host has one.
func (a *agent) offset(end int64) int64 {
	if a.proc == nil {
		return 0
	}
	return end
}

// approvalPrefix and approvalOptions are omp's permission prompt: a select
// titled "Allow tool: <tool>\n<details>" offering exactly Approve and Deny.
const approvalPrefix = "Allow tool: "

var approvalOptions = []string{"Approve", "Deny"}

// isToolCall reports whether a dialog event is the pi extension's call of
// a room tool.
func (a *agent) isToolCall(ev rpc.Event) bool {
	var req rpc.UIRequest
	if ev.Decode(&req) != nil {
		return false
	}
	_, _, ok := piext.ToolCall(req.Method, req.Title, req.Placeholder)
	return ok
}

// runTool runs the room tool the pi extension called.
func (a *agent) runTool(ctx context.Context, name string, args json.RawMessage) string {
	for _, t := range a.bd().tools {
		if t.Name == name {
			text, err := t.Run(ctx, room.ToolCall{Args: args})
			return piext.ToolResult(text, err)
		}
	}
	return piext.ToolResult("", fmt.Errorf("%w: %q", piext.ErrNoTool, name))
}

// askFirst makes each of the room's tools ask the room before it runs, in
// a room that asks (always-ask), with its arguments as the approval's input
// (redacted and bounded): the same on omp, whose own prompt for a host tool
// shows no arguments (answered Approve, see dialog), and on pi, whose
// extension runs the room's tools unasked. A denied call runs nothing and
// tells the agent so.
func askFirst(tools []room.Tool, h room.Handler, mode string) []room.Tool {
	if mode == room.ApprovalYolo || h == nil {
		return tools
	}
	out := make([]room.Tool, 0, len(tools))
	for _, t := range tools {
		run := t.Run
		t.Run = func(ctx context.Context, call room.ToolCall) (string, error) {
			if !h.Approve(ctx, room.ApprovalRequest{Tool: detail.Name(t.Name), Input: text(string(call.Args)), Options: approvalOptions}) {
				return "", fmt.Errorf("the room denied the call of %s", t.Name)
			}
			return run(ctx, call)
		}
		out = append(out, t)
	}
	return out
}

// roomToolNames are the names of tools.
func roomToolNames(tools []room.Tool) map[string]bool {
	m := make(map[string]bool, len(tools))
	for _, t := range tools {
		m[t.Name] = true
	}
	return m
}

// dialog turns the agent's dialogs into approvals and questions, and the
// pi extension's calls into room tool runs.
func (a *agent) dialog(ctx context.Context, req *rpc.UIRequest) rpc.UIResponse {
	if c := a.live.Load(); a.piext && c != nil {
		// pi starts a tool before its extension asks or calls the room,
		// and the listeners run behind the reader: the room records the
		// tool's start first, in pi's order.
		sctx, cancel := context.WithTimeout(ctx, a.refresh)
		_ = c.Sync(sctx)
		cancel()
	}
	if a.piext {
		if name, args, ok := piext.ToolCall(req.Method, req.Title, req.Placeholder); ok {
			return rpc.Value(a.runTool(ctx, name, args))
		}
	}
	if req.Method == "select" && strings.HasPrefix(req.Title, approvalPrefix) && slices.Equal(req.Options, approvalOptions) {
		tool, details, _ := strings.Cut(strings.TrimPrefix(req.Title, approvalPrefix), "\n")
		if a.bd().roomTools[tool] {
			// omp asks for a host tool without its arguments; the room's
			// tool asks the room itself when it runs, showing them.
			return rpc.Value("Approve")
		}
		if a.bd().h.Approve(ctx, room.ApprovalRequest{Tool: detail.Name(tool), Input: text(details), Options: req.Options, Start: a.offset(req.Start), Offset: a.offset(req.End)}) {
			return rpc.Value("Approve")
		}
		// Any reply but Approve denies; say it plainly.
		return rpc.Value("Deny")
	}
	title := ompOtherTitle(req.Title)
	if title == "" {
		title = req.Message
	}
	var options []string
	switch req.Method {
	case "select":
		options = req.Options
	case "confirm":
		options = []string{"yes", "no"}
	}
	// What the agent says is recorded redacted and bounded; an option the
	// room showed that way goes back as the agent's.
	shown := detail.Names(options)
	ans, ok := a.bd().h.Ask(ctx, room.QuestionRequest{Title: text(title), Options: shown, Start: a.offset(req.Start), Offset: a.offset(req.End)})
	if i := slices.Index(shown, strings.TrimSpace(ans)); ok && i >= 0 {
		ans = options[i]
	}
	switch {
	case !ok:
		return rpc.Cancelled()
	case req.Method == "confirm":
		return rpc.Confirmed(strings.EqualFold(strings.TrimSpace(ans), "yes"))
	}
	return rpc.Value(ans)
}

// ompOtherTitle is the title of omp's follow-up to "Other (type your
// own)", which repeats its terminal's picker ("○ red", "◉ Other (type your
// own)", "Enter your response:"), as the question and a note that it takes
// the person's own words; any other title as it is.
func ompOtherTitle(title string) string {
	if !strings.Contains(title, "\n◉ ") && !strings.HasPrefix(title, "◉ ") {
		return title
	}
	var keep []string
	for _, l := range strings.Split(title, "\n") {
		t := strings.TrimSpace(l)
		if t == "" || strings.HasPrefix(t, "○ ") || strings.HasPrefix(t, "◉ ") || t == "Enter your response:" {
			continue
		}
		keep = append(keep, l)
	}
	if len(keep) == 0 {
		return title
	}
	return strings.Join(keep, "\n") + " (your own answer)"
}

// text redacts and bounds what the agent says for the room's record.
func text(s string) string { return detail.Text(s, MaxDetail) }

func firstLine(s string) string {
	sc := bufio.NewScanner(strings.NewReader(s))
	if sc.Scan() {
		return sc.Text()
	}
	return s
}

// otlpEnv is env with the OTLP variables of the room's agent, when the
// operator asked for them (Options.OTLP).
func (t *Transport) otlpEnv(env []string, room string) []string {
	if t.opts.OTLP == nil {
		return env
	}
	return append(env, t.opts.OTLP(room)...)
}
