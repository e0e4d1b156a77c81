package agents

import (
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"

	"github.com/agenthost/agenthost/internal/agentfs"
)

// The agents that agenthost runs over ACP only.
const (
	// Claude is claude-agent-acp (npm @agentclientprotocol/claude-agent-acp).
	Claude Kind = "claude"
	// Codex is codex-acp (npm @agentclientprotocol/codex-acp).
	Codex Kind = "codex"
	// Copilot is GitHub Copilot's CLI run as `copilot --acp`.
	Copilot Kind = "copilot"
)

// ErrNoRecipe means no ACP recipe is known for the kind (yet).
var ErrNoRecipe = errors.New("agents: no ACP recipe for this agent")

// ACPOptions is what an ACP recipe is prepared for.
type ACPOptions struct {
	// Home is the agent's throwaway home (created if needed).
	Home string
	// ModelURL, if set, is the scripted model ("http://127.0.0.1:PORT/v1")
	// the home points the agent at; "" leaves the agent's own provider
	// configuration to the environment.
	ModelURL string
	// Yolo: the agent runs every tool without asking permission.
	Yolo bool
	// Instructions are appended to the agent's system prompt; a recipe
	// that cannot do that fails with ErrUnsupported when they are set.
	Instructions string
	// Workspace is the directory the agent will work in, if known: a recipe
	// whose agent would run what the workspace configures, unasked, refuses
	// it with ErrWorkspaceConfig.
	Workspace string
	// Confined: agenthost confines the agent (Landlock), inside which an
	// agent's own sandbox may not start (codex's bubblewrap).
	Confined bool
	// Owner, if set, gets what the recipe writes into Home (the agent
	// runs as a user of its own).
	Owner *agentfs.Owner
	// Model is the room's model ("provider/id"; "" the agent's default):
	// without a ModelURL its provider's key variables reach the agent (see
	// [Env]).
	Model string
	// PassEnv are more variables the agent gets as the server has them
	// (serve --agent-env).
	PassEnv []string
}

// ErrUnsupported means the agent cannot do what ACPOptions ask over ACP.
var ErrUnsupported = errors.New("agents: not supported by this agent")

// ErrWorkspaceConfig means the workspace carries configuration the agent
// would act on without asking (commands it runs by itself), which its recipe
// cannot switch off: the agent is not started there.
var ErrWorkspaceConfig = errors.New("agents: the workspace configures commands the agent would run unasked")

// ACPRecipe is how to run one agent over ACP.
type ACPRecipe struct {
	// Argv is the command line (never run through a shell); Env the whole
	// environment.
	Argv, Env []string
	// Model is the model id to select with session/set_model when the
	// room names none ("" keeps the agent's default).
	Model string
	// Mode, if set, is switched to with session/set_mode after
	// session/new and session/load (an agent whose default mode never
	// asks permission).
	Mode string
	// SessionMeta, if set, is sent as the _meta of session/new and
	// session/load (agent-specific session options).
	SessionMeta map[string]any
	// Dir, if set, is the folder the agent's process starts in ("" the
	// workspace; the session's folder is the workspace either way).
	Dir string
}

// ACPRecipeFunc prepares the recipe of one kind (see ACPRecipes).
type ACPRecipeFunc func(in *Install, opts ACPOptions) (ACPRecipe, error)

// ACPRecipes maps each ACP agent kind to its recipe (omp's is here, the
// others are in acppeers.go).
var ACPRecipes = map[Kind]ACPRecipeFunc{
	OMP:     ompACP,
	Claude:  claudeACP,
	Codex:   codexACP,
	Copilot: copilotACP,
}

// ACP returns the recipe for running agent k over ACP, its home prepared.
func (in *Install) ACP(k Kind, opts ACPOptions) (ACPRecipe, error) {
	f, ok := ACPRecipes[k]
	if !ok {
		return ACPRecipe{}, fmt.Errorf("%w: %q", ErrNoRecipe, k)
	}
	return f(in, opts)
}

// ompACP runs `omp acp`, its home reset (ResetHome) and pointed at the
// scripted model when there is one. The room's approval mode is pinned on
// the command line (always-ask unless yolo: omp acp's own default
// auto-approves workspace writes, and a workspace's .omp/config.yml could set
// yolo), and what omp would load from the workspace or the home by itself
// (MCP files, extension, hook, tool and plugin modules, settings, language
// servers, .env and bunfig.toml) is switched off or refused (see the note in
// ompguard.go): code a repository would run at start with no approval.
func ompACP(in *Install, opts ACPOptions) (ACPRecipe, error) {
	argv, err := in.Argv(OMP)
	if err != nil {
		return ACPRecipe{}, err
	}
	if !opts.Yolo && opts.Workspace != "" {
		if err := CheckOMPWorkspace(opts.Workspace, opts.Home); err != nil {
			return ACPRecipe{}, err
		}
	}
	if err := ResetHome(opts.Home, OMP, opts.Owner); err != nil {
		return ACPRecipe{}, err
	}
	r := ACPRecipe{Argv: append(argv, "acp")}
	if r.Dir, err = in.OMPStartDir(); err != nil {
		return ACPRecipe{}, err
	}
	if opts.ModelURL != "" {
		if r.Env, err = HomeWith(opts.Home, OMP, opts.ModelURL, HomeOptions{Owner: opts.Owner, PassEnv: opts.PassEnv}); err != nil {
			return ACPRecipe{}, err
		}
		r.Model = ModelID
	} else if r.Env, err = plainHome(opts.Home, OMP, opts); err != nil {
		return ACPRecipe{}, err
	}
	// Room tools and MCP servers come in session/new, not from the home.
	overlay, err := WriteOMPOverlayAs(opts.Home, OMPOverlay{BuiltinModel: opts.ModelURL != "", Ask: !opts.Yolo}, opts.Owner)
	if err != nil {
		return ACPRecipe{}, err
	}
	mode := "always-ask"
	if opts.Yolo {
		mode = "yolo"
	}
	r.Argv = append(r.Argv, OMPWorkspaceArgs(mode, overlay)...)
	if opts.Instructions != "" {
		r.Argv = append(r.Argv, "--append-system-prompt", opts.Instructions)
	}
	return r, nil
}

// plainHome makes dir the HOME of an agent of kind k on a named model
// (created for opts.Owner): its environment is [Env]'s, with the key
// variables of the room's model's provider (and of k's own).
func plainHome(dir string, k Kind, opts ACPOptions) ([]string, error) {
	d, err := agentfs.Create(dir, 0o700, opts.Owner)
	if err != nil {
		return nil, fmt.Errorf("agents: %w", err)
	}
	defer d.Close()
	if k == OMP {
		// A room's home was reset before (ResetHome); a prompt's throwaway home may hold a
		// copy of the user's settings (SeedHome), which are kept.
		if _, err := d.Lstat(filepath.Join(".omp", "agent", "config.yml")); errors.Is(err, fs.ErrNotExist) {
			if err := writeOMPConfig(dir, opts.Owner, false); err != nil {
				return nil, err
			}
		}
	}
	return homeEnv(dir, k, EnvOptions{Model: opts.Model, Pass: opts.PassEnv}), nil
}

// NamedModelHome prepares dir as the home of an agent of kind k (omp or pi)
// on a named model (not the built-in one), for owner: omp's quiet settings
// are written (its models file, if any, is the operator's), and the
// environment is [Env]'s with the key variables of model's provider and the
// names in pass.
func NamedModelHome(dir string, k Kind, model string, pass []string, owner *agentfs.Owner) ([]string, error) {
	return plainHome(dir, k, ACPOptions{Model: model, PassEnv: pass, Owner: owner})
}
