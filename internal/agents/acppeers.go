package agents

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// The recipes of the three ACP agents besides omp (claude-agent-acp, codex-acp, copilot --acp).
// Each gets its own throwaway home; with a model URL the home points it at the scripted model and
// nowhere else, and the switches below keep it offline (no telemetry, update checks, plugin
// fetches). The facts behind each switch were measured with the pinned versions.

// acpPackages maps the ACP-only kinds to their npm package folder under node_modules.
var acpPackages = map[Kind]string{
	Claude:  filepath.Join("@agentclientprotocol", "claude-agent-acp"),
	Codex:   filepath.Join("@agentclientprotocol", "codex-acp"),
	Copilot: filepath.Join("@github", "copilot"),
}

// ACPKinds are the agents that run over ACP, in the order reports list them.
var ACPKinds = []Kind{OMP, Claude, Codex, Copilot}

// CacheDir returns the cache shared by every run of the ACP agents (copilot unpacks ~235 MB into
// it on its first start); setup creates it inside the tools folder, which git ignores.
func (in *Install) CacheDir() string { return filepath.Join(in.Dir, "cache") }

// acpKey is the API key the scripted model is reached with; the model ignores it, the agents
// refuse to start without one.
const acpKey = "modelsim-no-key"

// claudeACP runs claude-agent-acp (the Claude Code CLI as its child) on Node. Its settings ask
// permission for tools (its default mode otherwise never asks) or, for yolo, bypass them.
func claudeACP(in *Install, opts ACPOptions) (ACPRecipe, error) {
	argv, err := in.nodeScript(Claude, filepath.Join("dist", "index.js"))
	if err != nil {
		return ACPRecipe{}, err
	}
	mode := "default"
	if opts.Yolo {
		mode = "bypassPermissions"
	}
	home, env, err := acpHome(opts)
	if err != nil {
		return ACPRecipe{}, err
	}
	settings := map[string]any{"permissions": map[string]any{"defaultMode": mode}}
	if err := writeJSON(filepath.Join(home, ".claude", "settings.json"), settings); err != nil {
		return ACPRecipe{}, err
	}
	env = append(env,
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1", "DISABLE_AUTOUPDATER=1",
		"DISABLE_ERROR_REPORTING=1")
	if os.Geteuid() == 0 {
		// Claude Code refuses to run as root (session/new fails) unless told it is sandboxed.
		env = append(env, "IS_SANDBOX=1")
	}
	if opts.ModelURL != "" {
		// The Anthropic SDK appends /v1/messages itself.
		env = append(env, "ANTHROPIC_BASE_URL="+strings.TrimSuffix(strings.TrimSuffix(opts.ModelURL, "/"), "/v1"),
			"ANTHROPIC_API_KEY="+acpKey)
	}
	// Claude Code would also start the MCP servers of the workspace's own .mcp.json: a repository
	// could inject servers into the room. Strict MCP config takes only session/new's.
	meta := map[string]any{"claudeCode": map[string]any{"options": map[string]any{"strictMcpConfig": true}}}
	return ACPRecipe{Argv: argv, Env: env, SessionMeta: meta}, nil
}

// codexACP runs codex-acp (with the codex binary) on Node. CODEX_HOME holds a config.toml whose
// only provider is the scripted model over the Responses API, with the features that reach the
// network (plugins, apps, tool suggestions) off; it asks permission only for commands that
// request escalation out of its workspace-write sandbox.
func codexACP(in *Install, opts ACPOptions) (ACPRecipe, error) {
	argv, err := in.nodeScript(Codex, filepath.Join("dist", "index.js"))
	if err != nil {
		return ACPRecipe{}, err
	}
	home, env, err := acpHome(opts)
	if err != nil {
		return ACPRecipe{}, err
	}
	codexHome := filepath.Join(home, ".codex")
	approval := "on-request"
	if opts.Yolo {
		approval = "never"
	}
	var b strings.Builder
	if opts.ModelURL != "" {
		fmt.Fprintf(&b, "model = %q\nmodel_provider = %q\n", modelName, providerName)
	}
	fmt.Fprintf(&b, "approval_policy = %q\nsandbox_mode = \"workspace-write\"\ncheck_for_update_on_startup = false\n\n", approval)
	if opts.ModelURL != "" {
		fmt.Fprintf(&b, "[model_providers.%s]\nname = \"modelsim\"\nbase_url = %q\nenv_key = \"FAKE_OPENAI_KEY\"\nwire_api = \"responses\"\n\n",
			providerName, opts.ModelURL)
	}
	b.WriteString("[analytics]\nenabled = false\n\n")
	// Without these codex resolves DNS names and runs `git ls-remote` at start.
	b.WriteString("[features]\nplugins = false\nremote_plugin = false\nplugin_discovery_prefetch = false\napps = false\ntool_suggest = false\n")
	if err := writeFile(filepath.Join(codexHome, "config.toml"), []byte(b.String())); err != nil {
		return ACPRecipe{}, err
	}
	env = append(env, "CODEX_HOME="+codexHome, "INITIAL_AGENT_MODE=workspace-write")
	if opts.ModelURL != "" {
		env = append(env, "FAKE_OPENAI_KEY="+acpKey)
	}
	return ACPRecipe{Argv: argv, Env: env}, nil
}

// copilotACP runs `copilot --acp` (its native binary). With a model URL it uses the scripted
// model as a custom OpenAI provider and needs no GitHub login.
func copilotACP(in *Install, opts ACPOptions) (ACPRecipe, error) {
	pkg, err := in.pkgDir(Copilot)
	if err != nil {
		return ACPRecipe{}, err
	}
	bin := ""
	// npm hoists the platform package next to copilot's, or nests it inside.
	for _, dir := range []string{filepath.Dir(pkg), filepath.Join(pkg, "node_modules", "@github")} {
		if p := filepath.Join(dir, "copilot-linux-x64", "copilot"); isExecutable(p) {
			bin = p
			break
		}
	}
	if bin == "" {
		return ACPRecipe{}, fmt.Errorf("%w: copilot's native binary (@github/copilot-linux-x64) next to %s; run `make setup`", ErrNotFound, pkg)
	}
	home, env, err := acpHome(opts)
	if err != nil {
		return ACPRecipe{}, err
	}
	argv := []string{bin, "--acp", "--no-auto-update"}
	if opts.Yolo {
		argv = append(argv, "--allow-all-tools")
	}
	env = append(env, "COPILOT_HOME="+filepath.Join(home, ".copilot"), "COPILOT_AUTO_UPDATE=false",
		"XDG_CACHE_HOME="+in.CacheDir())
	if opts.ModelURL != "" {
		env = append(env, "COPILOT_PROVIDER_BASE_URL="+opts.ModelURL, "COPILOT_PROVIDER_TYPE=openai",
			"COPILOT_PROVIDER_API_KEY="+acpKey, "COPILOT_MODEL="+modelName, "COPILOT_OFFLINE=true")
	}
	return ACPRecipe{Argv: argv, Env: env}, nil
}

// acpHome creates opts.Home and returns its absolute path and the agent's environment: with a
// model URL the parent's without credentials or config moves (as [Home]); without one the
// parent's, so the provider's key reaches the agent, with HOME replaced. The three peers take no
// appended instructions through their recipes: asked for some, it fails with [ErrUnsupported].
func acpHome(opts ACPOptions) (string, []string, error) {
	if opts.Instructions != "" {
		return "", nil, fmt.Errorf("%w: appended instructions (only omp's recipe passes them)", ErrUnsupported)
	}
	if opts.Home == "" {
		return "", nil, fmt.Errorf("agents: empty home dir")
	}
	home, err := filepath.Abs(opts.Home)
	if err != nil {
		return "", nil, fmt.Errorf("agents: home dir: %w", err)
	}
	if err := os.MkdirAll(home, 0o700); err != nil {
		return "", nil, fmt.Errorf("agents: %w", err)
	}
	if opts.ModelURL == "" {
		env, err := plainHome(home)
		return home, env, err
	}
	return home, agentEnv(os.Environ(), home), nil
}

// nodeScript returns [<abs node> <package>/<script>] for kind k.
func (in *Install) nodeScript(k Kind, script string) ([]string, error) {
	pkg, err := in.pkgDir(k)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(pkg, script)
	if !isFile(path) {
		return nil, fmt.Errorf("%w: %s has no %s; run `make setup`", ErrNotFound, pkg, script)
	}
	node, err := nodePath()
	if err != nil {
		return nil, err
	}
	return []string{node, path}, nil
}

func writeFile(path string, data []byte) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("agents: %w", err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		return fmt.Errorf("agents: %w", err)
	}
	return nil
}
