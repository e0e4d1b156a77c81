// Package transport starts rooms' agents: the room.Transport
// implementations `agenthost serve` uses, for a program that hosts rooms
// in its own process.
//
// NewRPC runs omp and pi in their RPC mode (and any command that speaks
// it, room.Config.Command): omp's approval dialogs and questions, and pi's
// through agenthost's pi extension (written into pi's home, which also
// gives pi the room's host tools), become the room's approvals and
// questions. NewACP runs agents over the Agent Client Protocol (omp acp,
// claude-agent-acp, codex-acp, copilot --acp, or a command): their
// permission requests become the room's approvals.
//
// Each room's agent runs in a custody scope (Options.Custodian, which ends
// it and everything it started), in the room's workspace, with a home of
// its own that the transport writes (the model, the MCP servers) and a
// session that a later agent of the room resumes. With
// Options.Confinement it is confined to its room (Landlock: the room's
// folders read-write, the system and the installed agents read-only, the
// network as configured).
//
// A confined agent is started through a launcher: this program,
// re-executed (os.Executable), restricts itself and executes the agent.
// Nothing is asked of the program for it: an init function of this
// package's dependencies makes the program the launcher when it was
// started as one, so the program's own init functions and main never run
// there. The program's file must stay in place while it runs.
//
// The agents come from a tools folder (Options.Tools; `make setup` in an
// agenthost checkout fills its .tools): omp 18.2.3 on Bun, pi 0.73.1 on
// Node (from PATH); `make setup-acp` adds the ACP-only agents.
//
// Platforms: Linux gets all of the above. Elsewhere agents run
// unconfined (ConfineAuto falls back; ConfineLandlock fails), and custody
// ends their process groups (macOS, BSDs) or job objects (Windows).
package transport

import (
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strconv"
	"time"

	"github.com/agenthost/agenthost/custody"
	"github.com/agenthost/agenthost/internal/acpagent"
	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/confine"
	"github.com/agenthost/agenthost/internal/rpcagent"
	"github.com/agenthost/agenthost/room"
)

// ToolsEnv names the variable that says where the tools folder is when
// Options.Tools is empty.
const ToolsEnv = "AGENTHOST_TOOLS"

// ErrNotFound is returned when the tools folder, an agent or its runtime
// is missing.
var ErrNotFound = agents.ErrNotFound

// ErrEnvName is returned for an Options.AgentEnv name that is no variable
// name, or is the program's own (AGENTHOST_*) or the room's (HOME,
// TMPDIR).
var ErrEnvName = agents.ErrEnvName

// ErrUnsupported is returned for ConfineLandlock on a kernel that cannot
// enforce the confinement asked for.
var ErrUnsupported = confine.ErrUnsupported

// ConfineMode says whether agents are confined.
type ConfineMode string

// Confinement modes.
const (
	// ConfineAuto confines with Landlock where the kernel has it and runs
	// agents unconfined elsewhere (Transport's Confinement says which).
	ConfineAuto ConfineMode = "auto"
	// ConfineLandlock confines with Landlock; the constructors fail with
	// ErrUnsupported where the kernel cannot.
	ConfineLandlock ConfineMode = "landlock"
	// ConfineOff runs agents unconfined.
	ConfineOff ConfineMode = "off"
)

// Confinement is how each room's agent is confined (serve's --confine,
// --confine-net and --agent-uids). The zero value is ConfineAuto with the
// network open and agents running as this program's user.
type Confinement struct {
	// Mode: "" is ConfineAuto.
	Mode ConfineMode
	// Net is nil for any network; else the only TCP ports agents may
	// connect to (bind is then denied). Options.ModelURL's port is added.
	Net []uint16
	// FirstUID and LastUID, when set and the program runs as root, are a
	// range of uids (and gids) the rooms' agents run as, one of its own
	// for each room, owning the room's workspace and home (within
	// 65536 to 2^31-1; serve's default is 2000000000-2000999999); zero:
	// agents run as this program's user.
	FirstUID, LastUID int
}

// Options configure NewRPC and NewACP. Custodian is required.
type Options struct {
	// Custodian owns every agent process; close it after the Manager.
	Custodian *custody.Custodian
	// Tools is the tools folder holding the installed agents (its
	// node_modules). "": $AGENTHOST_TOOLS, else the first .tools folder
	// above the working directory, then above the executable. Not needed
	// when every room runs a command of its own (room.Config.Command).
	Tools string
	// ModelURL, if set, points every agent at that model server (a
	// modeltest.Server's URL, or any OpenAI-compatible one with no key):
	// the agent selects it unless its room names another model. "": each
	// agent uses its own provider configuration, with the key variables
	// of the room's model's provider passed from this program's
	// environment.
	ModelURL string
	// Confinement confines each agent to its room (see Confinement).
	Confinement Confinement
	// AgentEnv names more variables of this program's environment that
	// every agent gets (serve --agent-env); agents otherwise get an
	// allowlist (PATH, HOME, locale, proxies and the model's keys).
	AgentEnv []string
	// StartTimeout bounds an agent's start and session checks (0: 90 s).
	StartTimeout time.Duration
	// Logger gets the transport's lines (never prompts or frames). nil:
	// discard.
	Logger *slog.Logger
}

// NewRPC returns the transport for omp and pi in RPC mode (room.Config.Agent
// "omp", the default, or "pi"), or a command that speaks their protocol.
// Besides room.Transport, the value implements room.Confined (what
// confines the agents, shown in each room's state) and
// room.ThinkingLeveler (the thinking levels each agent takes, checked when
// a room's settings are set).
func NewRPC(opts Options) (room.Transport, error) {
	in, cf, err := prepare(opts)
	if err != nil {
		return nil, err
	}
	return rpcagent.New(rpcagent.Options{Custodian: opts.Custodian, Install: in, ModelURL: opts.ModelURL, Confine: cf,
		AgentEnv: opts.AgentEnv, StartTimeout: opts.StartTimeout, Logger: opts.Logger})
}

// NewACP returns the transport for agents over ACP (room.Config.Agent
// "omp", the default, "claude", "codex" or "copilot"), or a command that
// speaks ACP. The ACP-only agents must be installed (`make setup-acp`).
// Besides room.Transport, the value implements room.Confined.
func NewACP(opts Options) (room.Transport, error) {
	in, cf, err := prepare(opts)
	if err != nil {
		return nil, err
	}
	return acpagent.New(acpagent.Options{Custodian: opts.Custodian, Install: in, ModelURL: opts.ModelURL, Confine: cf,
		AgentEnv: opts.AgentEnv, StartTimeout: opts.StartTimeout, Logger: opts.Logger})
}

// prepare checks opts and resolves the install and the confinement.
func prepare(opts Options) (*agents.Install, *confine.Confiner, error) {
	if opts.Custodian == nil {
		return nil, nil, errors.New("transport: Options.Custodian is required")
	}
	if err := agents.CheckEnvNames(opts.AgentEnv); err != nil {
		return nil, nil, fmt.Errorf("transport: Options.AgentEnv: %w", err)
	}
	in, err := install(opts.Tools)
	if errors.Is(err, agents.ErrNotFound) && opts.Tools == "" {
		// No error here: rooms may all run commands of their own. A
		// room on omp or pi then fails its agent's start.
		if opts.Logger != nil {
			opts.Logger.Warn("transport: no tools folder found: rooms can run only commands of their own (room.Config.Command)", "err", err)
		}
		in, err = nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	cf, err := confiner(opts.Confinement, in, opts.ModelURL)
	if err != nil {
		return nil, nil, err
	}
	if w := cf.Warning(); w != "" && opts.Logger != nil {
		opts.Logger.Warn("transport: confinement: " + w)
	}
	return in, cf, nil
}

// install finds the tools folder: tools, else as agents.Find does.
func install(tools string) (*agents.Install, error) {
	if tools != "" {
		abs, err := filepath.Abs(tools)
		if err != nil {
			return nil, fmt.Errorf("transport: Options.Tools %q: %w", tools, err)
		}
		in := &agents.Install{Dir: abs}
		if _, err := in.Version(agents.OMP); err != nil {
			if _, perr := in.Version(agents.Pi); perr != nil {
				return nil, fmt.Errorf("transport: Options.Tools %q: %w", tools, err)
			}
		}
		return in, nil
	}
	return agents.Find()
}

// confiner builds the confinement; the model's port joins a port list.
func confiner(c Confinement, in *agents.Install, modelURL string) (*confine.Confiner, error) {
	mode, err := confine.ParseMode(string(c.Mode))
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	var uids confine.UIDRange
	if c.FirstUID != 0 || c.LastUID != 0 {
		// Through the flag's parser, so that a range set wrong is refused
		// rather than taken as none.
		if uids, err = confine.ParseUIDs(fmt.Sprintf("%d-%d", c.FirstUID, c.LastUID)); err != nil {
			return nil, fmt.Errorf("transport: Confinement's uids: %w", err)
		}
	}
	var ports []uint16
	if p := urlPort(modelURL); p != 0 {
		ports = append(ports, p)
	}
	tools := ""
	if in != nil {
		tools = in.Dir
	}
	cf, err := confine.New(confine.Options{Mode: mode, Net: c.Net, Ports: ports, Tools: tools, AgentUIDs: uids})
	if err != nil {
		return nil, fmt.Errorf("transport: %w", err)
	}
	return cf, nil
}

// urlPort is the port of an http(s) URL (0 when it names none).
func urlPort(raw string) uint16 {
	u, err := url.Parse(raw)
	if raw == "" || err != nil {
		return 0
	}
	switch p := u.Port(); {
	case p != "":
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil {
			return 0
		}
		return uint16(n)
	case u.Scheme == "http":
		return 80
	case u.Scheme == "https":
		return 443
	}
	return 0
}
