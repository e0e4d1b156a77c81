package agents

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/agenthost/agenthost/internal/agentfs"
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
// permission for tools (its default mode otherwise never asks) or, for yolo, bypass them, and turn
// hooks off. Claude Code reads only those settings: the adapter starts it with the user, project
// and local setting sources, and a workspace's .claude/settings.json (or settings.local.json)
// could then bypass permissions, pre-allow tools or run hooks; the session's _meta narrows it to
// the throwaway home's ("user"), and the mode is set again with session/set_mode after every
// session/new and session/load, over whatever the workspace's settings name.
func claudeACP(in *Install, opts ACPOptions) (ACPRecipe, error) {
	argv, err := in.nodeScript(Claude, filepath.Join("dist", "index.js"))
	if err != nil {
		return ACPRecipe{}, err
	}
	mode := "default"
	if opts.Yolo {
		mode = "bypassPermissions"
	}
	home, env, err := acpHome(Claude, opts)
	if err != nil {
		return ACPRecipe{}, err
	}
	// No prompt suggestions: each would be one more model request after every turn, in the
	// background, which the turn's usage does not count but the provider bills.
	settings := map[string]any{"permissions": map[string]any{"defaultMode": mode}, "disableAllHooks": true,
		"promptSuggestionEnabled": false}
	if err := writeJSON(home, opts.Owner, filepath.Join(".claude", "settings.json"), settings); err != nil {
		return ACPRecipe{}, err
	}
	env = append(env,
		"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1", "DISABLE_TELEMETRY=1", "DISABLE_AUTOUPDATER=1",
		"DISABLE_ERROR_REPORTING=1", "CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION=false")
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
	options := map[string]any{"strictMcpConfig": true, "settingSources": []string{"user"}}
	if !opts.Yolo {
		// Bypass mode is then not offered at all, whoever asks for it.
		options["allowDangerouslySkipPermissions"] = false
	}
	meta := map[string]any{"claudeCode": map[string]any{"options": options}}
	return ACPRecipe{Argv: argv, Env: env, Mode: mode, SessionMeta: meta}, nil
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
	home, env, err := acpHome(Codex, opts)
	if err != nil {
		return ACPRecipe{}, err
	}
	codexHome := filepath.Join(home, ".codex")
	approval, sandbox, mode := "on-request", "workspace-write", "workspace-write"
	if opts.Yolo {
		approval = "never"
	}
	if opts.Yolo && opts.Confined {
		// codex's bubblewrap cannot start inside Landlock (no mounts, no
		// uid map): with no approvals to ask, its commands run without its
		// sandbox, in agenthost's. Asking rooms keep it: a command it
		// would sandbox fails, one the model asks to run escalated (an
		// approval) runs.
		sandbox, mode = "danger-full-access", "agent-full-access"
	}
	var b strings.Builder
	if opts.ModelURL != "" {
		fmt.Fprintf(&b, "model = %q\nmodel_provider = %q\n", modelName, providerName)
	}
	fmt.Fprintf(&b, "approval_policy = %q\nsandbox_mode = %q\ncheck_for_update_on_startup = false\n\n", approval, sandbox)
	if opts.ModelURL != "" {
		fmt.Fprintf(&b, "[model_providers.%s]\nname = \"modelsim\"\nbase_url = %q\nenv_key = \"FAKE_OPENAI_KEY\"\nwire_api = \"responses\"\n\n",
			providerName, opts.ModelURL)
	}
	b.WriteString("[analytics]\nenabled = false\n\n")
	// Without these codex resolves DNS names and runs `git ls-remote` at start.
	b.WriteString("[features]\nplugins = false\nremote_plugin = false\nplugin_discovery_prefetch = false\napps = false\ntool_suggest = false\n")
	if err := writeFile(home, opts.Owner, filepath.Join(".codex", "config.toml"), []byte(b.String())); err != nil {
		return ACPRecipe{}, err
	}
	env = append(env, "CODEX_HOME="+codexHome, "INITIAL_AGENT_MODE="+mode)
	if opts.ModelURL != "" {
		env = append(env, "FAKE_OPENAI_KEY="+acpKey)
	}
	return ACPRecipe{Argv: argv, Env: env}, nil
}

// copilotACP runs `copilot --acp` (its native binary). With a model URL it uses the scripted
// model as a custom OpenAI provider and needs no GitHub login. It is not started in a workspace
// that carries repository hooks (see checkCopilotHooks).
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
	if err := checkCopilotHooks(opts.Workspace); err != nil {
		return ACPRecipe{}, err
	}
	home, env, err := acpHome(Copilot, opts)
	if err != nil {
		return ACPRecipe{}, err
	}
	argv := []string{bin, "--acp", "--no-auto-update"}
	if opts.Yolo {
		argv = append(argv, "--allow-all-tools")
	}
	copilotHome := filepath.Join(home, ".copilot")
	env = append(env, "COPILOT_HOME="+copilotHome, "COPILOT_AUTO_UPDATE=false",
		"XDG_CACHE_HOME="+in.CacheDir())
	if opts.ModelURL != "" {
		env = append(env, "COPILOT_PROVIDER_BASE_URL="+opts.ModelURL, "COPILOT_PROVIDER_TYPE=openai",
			"COPILOT_PROVIDER_API_KEY="+acpKey, "COPILOT_MODEL="+modelName, "COPILOT_OFFLINE=true")
	}
	if opts.Confined {
		if err := warmCopilot(in, bin, env); err != nil {
			return ACPRecipe{}, err
		}
	}
	return ACPRecipe{Argv: argv, Env: env}, nil
}

// copilotWarmTimeout bounds unpacking copilot into the cache (9 s on an idle two-core machine).
const copilotWarmTimeout = 3 * time.Minute

// warmCopilot unpacks copilot into the shared cache unless it is there (its first start does, ~235
// MB): a confined copilot may read the cache but not write it, since a cache every room's agent
// could write would carry code from one room into another.
func warmCopilot(in *Install, bin string, env []string) error {
	v, err := in.Version(Copilot)
	if err != nil {
		return err
	}
	pkg := filepath.Join(in.CacheDir(), "copilot", "pkg", "linux-x64", v)
	if isDir(pkg) {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), copilotWarmTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "--version", "--no-auto-update")
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err == nil && !isDir(pkg) {
		err = errors.New("it unpacked nothing there")
	}
	if err != nil {
		return fmt.Errorf("agents: unpacking copilot %s into %s before its first confined start: %w (%s)", v, in.CacheDir(), err,
			strings.TrimSpace(string(out[max(0, len(out)-300):])))
	}
	return nil
}

// acpHome creates opts.Home and returns its absolute path and the environment of the agent of
// kind: with a model URL [Env]'s with no provider's key (as [Home]); without one [Env]'s with
// the keys of the agent's own provider and of the room's model. The three peers take no
// appended instructions through their recipes: asked for some, it fails with [ErrUnsupported].
func acpHome(kind Kind, opts ACPOptions) (string, []string, error) {
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
	d, err := agentfs.Create(home, 0o700, opts.Owner)
	if err != nil {
		return "", nil, fmt.Errorf("agents: %w", err)
	}
	d.Close()
	if opts.ModelURL == "" {
		env, err := plainHome(home, kind, opts)
		return home, env, err
	}
	return home, builtinEnv(os.Environ(), home, kind, opts.PassEnv), nil
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

// checkCopilotHooks refuses a workspace whose repository hooks copilot would run: every
// .github/hooks/*.json of the workspace, or of the git repository it is in, runs shell commands at
// session start, at each prompt and before each tool, asked about by nobody. Measured with copilot
// 1.0.102 over ACP: they run, and nothing in the agent's home switches them off (disableAllHooks,
// in its settings.json or in a hooks file of its own, covers only the home's hooks). "" checks
// nothing.
func checkCopilotHooks(workspace string) error {
	if workspace == "" {
		return nil
	}
	dir, err := filepath.Abs(workspace)
	if err != nil {
		return fmt.Errorf("agents: workspace: %w", err)
	}
	// copilot reads the hooks of the git root the workspace is in, else the workspace's own.
	dirs := []string{dir}
	for d := dir; d != filepath.Dir(d); d = filepath.Dir(d) {
		if _, err := os.Lstat(filepath.Join(d, ".git")); err == nil {
			if d != dir {
				dirs = append(dirs, d)
			}
			break
		}
	}
	for _, d := range dirs {
		hooks := filepath.Join(d, ".github", "hooks")
		ents, err := os.ReadDir(hooks)
		switch {
		case err == nil && len(ents) > 0:
			return fmt.Errorf("%w: copilot runs the repository hooks in %s (%d entries) without asking; remove them to run copilot here",
				ErrWorkspaceConfig, hooks, len(ents))
		case err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR):
			return fmt.Errorf("%w: cannot tell whether %s holds repository hooks: %v", ErrWorkspaceConfig, hooks, err)
		}
	}
	return nil
}
