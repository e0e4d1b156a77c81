package agents

import (
	"encoding/json"
	"fmt"
	"path/filepath"

	"github.com/agenthost/agenthost/internal/agentfs"
)

// What keeps a workspace's own omp configuration from loosening what the host decided. omp merges
// the workspace's project settings (.omp/config.yml, .claude/settings.json, ...) over its home's,
// then the --config overlays, then the command line; and at start it loads the workspace's
// extension modules, hooks, custom tool modules and MCP files. A repository is not trusted with
// any of that (measured with omp 18.2.3: a project tools.approvalMode: yolo made every tool run
// unasked, and .omp/extensions, .omp/hooks and .omp/tools modules ran their code at start).

// OMPOverlayName is the config overlay's file name in the agent's home.
const OMPOverlayName = "agenthost-overlay.yml"

// ompLocalModelProviders are the local model servers omp probes at start (127.0.0.1:11434, :8080,
// :1234); a home on the built-in model switches them off (see HomeWith), and the overlay's list
// replaces the home's.
var ompLocalModelProviders = []string{"ollama", "llama.cpp", "lm-studio"}

// ompForeignToolProviders are omp's discovery providers that load custom tool modules from a
// workspace's .claude/tools and .codex/tools (code that runs when omp starts).
var ompForeignToolProviders = []string{"claude", "codex"}

// OMPOverlay says what the overlay switches off besides the workspace's MCP files.
type OMPOverlay struct {
	// BuiltinModel: the home is on the built-in model, so the local model servers stay off.
	BuiltinModel bool
	// NoNative also switches off omp's own provider, which loads the workspace's .omp/tools
	// modules, and the home's .omp/agent files other than its settings and models (its mcp.json
	// among them: not for agents whose room MCP servers are written there, as over RPC).
	NoNative bool
	// UserConfig: omp runs on the user's own configuration (`agenthost prompt --model`), whose
	// list of disabled providers the overlay's would replace: the overlay then only switches the
	// workspace's MCP files and per-tool policies off.
	UserConfig bool
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
	disabled := append([]string{}, ompForeignToolProviders...)
	if o.NoNative {
		disabled = append(disabled, "native")
	}
	if o.BuiltinModel {
		disabled = append(disabled, ompLocalModelProviders...)
	}
	overlay := map[string]any{
		// The workspace's .mcp.json, mcp.json and .omp/mcp.json: a repository could inject servers.
		"mcp":               map[string]any{"enableProjectConfig": false},
		"disabledProviders": disabled,
		// Per-tool policies (tools.approval.bash: allow) outrank the approval mode, and settings
		// layers merge maps key by key: a list replaces the workspace's map, and omp reads a
		// list as no policy at all (measured: a project's bash: allow ran bash unasked over RPC).
		"tools": map[string]any{"approval": []any{}},
	}
	if o.UserConfig {
		delete(overlay, "disabledProviders")
	}
	// JSON is YAML; encoding/json quotes every value safely (and cannot fail on these types).
	data, _ := json.MarshalIndent(overlay, "", "  ")
	return string(data) + "\n"
}

// OMPWorkspaceArgs are omp's flags that pin approvalMode ("always-ask" or "yolo": the command
// line wins over every settings layer, the workspace's included), load the overlay, and switch
// off the discovery of extension modules and hooks (the workspace's .omp/extensions,
// .omp/hooks, ...: code that runs when omp starts, before any tool call could be asked about).
func OMPWorkspaceArgs(approvalMode, overlay string) []string {
	return []string{"--approval-mode", approvalMode, "--config", overlay, "--no-extensions"}
}
