package agents

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"github.com/agenthost/agenthost/internal/agentfs"
)

// What keeps a workspace's own omp configuration (and what the agent planted in its home) from
// loosening what the host decided or running unasked. omp merges the workspace's project settings
// (.omp/config.yml, .claude/settings.json, ...) over its home's, then the --config overlays, then
// the command line; and at start it loads extension modules, hooks, custom tool modules, plugins,
// MCP servers and language servers from the workspace and the home. A repository is not trusted
// with any of that (measured with omp 18.2.3: a project tools.approvalMode: yolo made every tool
// run unasked, .omp/extensions, .omp/hooks and .omp/tools modules ran their code at start, a
// bunfig.toml's preload ran before omp, and a .env's XDG_DATA_HOME=. loaded plugins from it).
//
// So omp runs with: the overlay below (every discovery provider that loads code, commands or
// settings off: omp's own "native" one with the workspace's and home's .omp/tools; no foreign
// config opted in; the workspace's MCP files and per-tool policies off; language servers off in
// rooms that ask), --no-extensions (extension and hook modules), its process started in its own
// package folder with the workspace given by --cwd (Bun and omp read bunfig.toml and .env from the
// process's folder at start, before any flag), Bun's own .env loading off (see Install.Argv), its
// folders pinned in the environment, and its home reset at each start (ResetHome). What stays
// loaded from the workspace is text for the model (AGENTS.md, CLAUDE.md, rules, skills). What
// cannot be switched off, the workspace's own plugins folder, is refused in rooms that ask
// (CheckOMPWorkspace).

// OMPOverlayName is the config overlay's file name in the agent's home.
const OMPOverlayName = "agenthost-overlay.yml"

// OMPMCPFile is where the room's MCP servers are written in the agent's home (relative to it):
// Windsurf's user MCP file, which omp reads through its "windsurf" provider when the overlay opts
// it in. omp's own user MCP file is read by its "native" provider, which the overlay switches off
// (it also loads .omp/tools modules), and Windsurf's provider loads MCP servers and rules (text)
// only.
const OMPMCPFile = ".codeium/windsurf/mcp_config.json"

// ompLocalModelProviders are the local model servers omp probes at start (127.0.0.1:11434, :8080,
// :1234); a home on the built-in model switches them off (see HomeWith), and the overlay's list
// replaces the home's.
var ompLocalModelProviders = []string{"ollama", "llama.cpp", "lm-studio"}

// ompCodeProviders are omp's discovery providers that load code, commands or settings from the
// workspace or the home: custom tool, extension and hook modules, plugins (with their MCP servers
// and language servers), project settings (a shellPath runs every approved command), slash
// commands. What remains on are the providers of text for the model (AGENTS.md, CLAUDE.md,
// .agents, .github and Cline rules, skills and prompts), the MCP providers of the workspace
// (switched off by mcp.enableProjectConfig) and Windsurf's (the room's MCP file).
var ompCodeProviders = []string{
	"native", "claude", "codex", "cursor", "gemini", "opencode", "claude-plugins", "omp-plugins", "agent-plugins",
}

// OMPOverlay says what the overlay switches off besides the workspace's MCP files.
type OMPOverlay struct {
	// BuiltinModel: the home is on the built-in model, so the local model servers stay off.
	BuiltinModel bool
	// MCP: the room's MCP servers are in the home's OMPMCPFile, which the overlay opts in.
	MCP bool
	// Ask: the room asks before tools run; the language servers omp would start (the
	// workspace's lsp.json commands, its node_modules/.bin servers) stay off.
	Ask bool
}

// WriteOMPOverlay writes the overlay into home (created if needed) and returns its path: see
// WriteOMPOverlayAs.
func WriteOMPOverlay(home string, o OMPOverlay) (string, error) {
	return WriteOMPOverlayAs(home, o, nil)
}

// WriteOMPOverlayAs writes the overlay into home (created if needed), given to owner (nil: the
// server's user), and returns its path. A link the agent planted in its place is replaced, never
// written through (agentfs).
func WriteOMPOverlayAs(home string, o OMPOverlay, owner *agentfs.Owner) (string, error) {
	abs, err := filepath.Abs(home)
	if err != nil {
		return "", fmt.Errorf("agents: home dir: %w", err)
	}
	if err := writeFile(abs, owner, OMPOverlayName, []byte(OMPOverlayText(o))); err != nil {
		return "", err
	}
	return filepath.Join(abs, OMPOverlayName), nil
}

// OMPOverlayText is what WriteOMPOverlay writes.
func OMPOverlayText(o OMPOverlay) string {
	disabled := append([]string{}, ompCodeProviders...)
	if o.BuiltinModel {
		disabled = append(disabled, ompLocalModelProviders...)
	}
	// Foreign tools' home configuration is opt-in (enabledProviders); the list replaces whatever
	// the home's settings opted in.
	enabled := []string{}
	if o.MCP {
		enabled = append(enabled, "windsurf")
	}
	overlay := map[string]any{
		// The workspace's .mcp.json, mcp.json and .omp/mcp.json: a repository could inject servers.
		"mcp":               map[string]any{"enableProjectConfig": false},
		"disabledProviders": disabled,
		"enabledProviders":  enabled,
		// Per-tool policies (tools.approval.bash: allow) outrank the approval mode, and settings
		// layers merge maps key by key: a list replaces the workspace's map, and omp reads a
		// list as no policy at all (measured: a project's bash: allow ran bash unasked over RPC).
		"tools": map[string]any{"approval": []any{}},
	}
	if o.Ask {
		overlay["lsp"] = map[string]any{"enabled": false}
	}
	// JSON is YAML; encoding/json quotes every value safely (and cannot fail on these types).
	data, _ := json.MarshalIndent(overlay, "", "  ")
	return string(data) + "\n"
}

// OMPWorkspaceArgs are omp's flags that pin approvalMode ("always-ask" or "yolo": the command
// line wins over every settings layer, the workspace's included), load the overlay, and switch
// off the discovery of extension modules and hooks (the workspace's .omp/extensions,
// .omp/hooks, ...: code that runs when omp starts, before any tool call could be asked about)
// and, in a room that asks, the language servers (commands the workspace names or carries).
func OMPWorkspaceArgs(approvalMode, overlay string) []string {
	args := []string{"--approval-mode", approvalMode, "--config", overlay, "--no-extensions"}
	if approvalMode != "yolo" {
		args = append(args, "--no-lsp")
	}
	return args
}

// OMPCwdArgs give omp its workspace: its process starts elsewhere ([Install.OMPStartDir]).
func OMPCwdArgs(workspace string) []string { return []string{"--cwd", workspace} }

// OMPStartDir is the folder omp's process starts in: its own package folder, which no room can
// write and which holds no .env or bunfig.toml (Bun runs a bunfig.toml's preload modules and omp
// loads a .env from the process's folder at start, before any flag is read).
func (in *Install) OMPStartDir() (string, error) { return in.pkgDir(OMP) }

// ErrOMPPlugins is CheckOMPWorkspace's: the workspace carries omp plugins, which omp loads at
// start whatever its settings say.
var ErrOMPPlugins = fmt.Errorf("%w: omp loads the plugins of the workspace's .omp/plugins at start, and nothing switches them off", ErrWorkspaceConfig)

// CheckOMPWorkspace refuses (ErrOMPPlugins, naming the folder) a workspace from which omp would
// load plugin modules: the nearest .omp folder above workspace (or, with none, the git root's),
// up to home, holding plugins/node_modules, as omp 18.2.3 resolves its project plugin registry.
// Rooms that ask call it before omp starts; a yolo room runs what it is given anyway.
func CheckOMPWorkspace(workspace, home string) error {
	ws, err := filepath.Abs(workspace)
	if err != nil {
		return fmt.Errorf("agents: workspace: %w", err)
	}
	root := ""
	for d := ws; d != home; d = filepath.Dir(d) {
		if fi, err := os.Stat(filepath.Join(d, ".omp")); err == nil && fi.IsDir() {
			root = d
			break
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	if root == "" {
		for d := ws; d != home; d = filepath.Dir(d) {
			if _, err := os.Stat(filepath.Join(d, ".git")); err == nil {
				root = d
				break
			}
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	if root == "" {
		return nil
	}
	plugins := filepath.Join(root, ".omp", "plugins", "node_modules")
	if _, err := os.Stat(plugins); err == nil {
		return fmt.Errorf("%w (%s); remove it to run omp here with approvals", ErrOMPPlugins, plugins)
	} else if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
		return fmt.Errorf("%w: cannot tell whether %s holds plugins: %v", ErrWorkspaceConfig, plugins, err)
	}
	return nil
}
