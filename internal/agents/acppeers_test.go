package agents_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/agents"
)

// fakeACPTools is fakeTools plus stubs of the three ACP agents' packages.
func fakeACPTools(t *testing.T) string {
	t.Helper()
	dir := fakeTools(t)
	files := map[string]string{
		"node_modules/@agentclientprotocol/claude-agent-acp/package.json":  `{"version":"0.101.0"}`,
		"node_modules/@agentclientprotocol/claude-agent-acp/dist/index.js": "",
		"node_modules/@agentclientprotocol/codex-acp/package.json":         `{"version":"2.6.0"}`,
		"node_modules/@agentclientprotocol/codex-acp/dist/index.js":        "",
		"node_modules/@github/copilot/package.json":                        `{"version":"1.0.102"}`,
		"node_modules/@github/copilot-linux-x64/copilot":                   "#!/bin/sh\n",
	}
	for name, content := range files {
		path := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func envValue(env []string, name string) (string, bool) {
	for i := len(env) - 1; i >= 0; i-- {
		if v, ok := strings.CutPrefix(env[i], name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// TestInstall_ACPRecipes checks what each peer's recipe writes and sets: the home points at the
// scripted model only, permissions are asked unless yolo, and no parent credential leaks.
func TestInstall_ACPRecipes(t *testing.T) {
	tools := fakeACPTools(t)
	pathDir := t.TempDir()
	node := filepath.Join(pathDir, "node")
	if err := os.WriteFile(node, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", pathDir)
	t.Setenv("OPENAI_API_KEY", "leak")
	t.Setenv("GITHUB_TOKEN", "leak")
	in := &agents.Install{Dir: tools}
	const url = "http://127.0.0.1:4000/v1"

	for k, want := range map[agents.Kind]string{agents.Claude: "0.101.0", agents.Codex: "2.6.0", agents.Copilot: "1.0.102"} {
		if v, err := in.Version(k); v != want || err != nil {
			t.Errorf("Version(%s) = %q, %v; want %q", k, v, err, want)
		}
	}

	for _, yolo := range []bool{false, true} {
		home := t.TempDir()
		r, err := in.ACP(agents.Claude, agents.ACPOptions{Home: home, ModelURL: url, Yolo: yolo})
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{node, filepath.Join(tools, "node_modules/@agentclientprotocol/claude-agent-acp/dist/index.js")}; !slices.Equal(r.Argv, want) {
			t.Errorf("claude argv %q, want %q", r.Argv, want)
		}
		var settings struct {
			Permissions             struct{ DefaultMode string }
			DisableAllHooks         bool
			PromptSuggestionEnabled *bool
		}
		data, err := os.ReadFile(filepath.Join(home, ".claude", "settings.json"))
		if err != nil || json.Unmarshal(data, &settings) != nil {
			t.Fatalf("claude settings: %s, %v", data, err)
		}
		mode := map[bool]string{false: "default", true: "bypassPermissions"}[yolo]
		if settings.Permissions.DefaultMode != mode || !settings.DisableAllHooks || r.Mode != mode {
			t.Errorf("claude settings %s, session mode %q (yolo %v): want defaultMode and mode %q, hooks off", data, r.Mode, yolo, mode)
		}
		// Only the home's settings: the workspace's own could bypass permissions or run hooks.
		opts, _ := r.SessionMeta["claudeCode"].(map[string]any)["options"].(map[string]any)
		if src, _ := opts["settingSources"].([]string); !slices.Equal(src, []string{"user"}) {
			t.Errorf("claude settingSources %v, want [user]", opts["settingSources"])
		}
		if skip, set := opts["allowDangerouslySkipPermissions"]; set == yolo || (set && skip != false) {
			t.Errorf("claude allowDangerouslySkipPermissions %v (set %v) with yolo %v", skip, set, yolo)
		}
		// Prompt suggestions would be billed model requests after every turn that the turn's
		// usage leaves out.
		if p := settings.PromptSuggestionEnabled; p == nil || *p {
			t.Errorf("claude promptSuggestionEnabled %v, want false", p)
		}
		for name, want := range map[string]string{
			"ANTHROPIC_BASE_URL": "http://127.0.0.1:4000", "HOME": home, "DISABLE_TELEMETRY": "1",
			"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1",
			"CLAUDE_CODE_ENABLE_PROMPT_SUGGESTION": "false",
		} {
			if v, _ := envValue(r.Env, name); v != want {
				t.Errorf("claude %s=%q, want %q", name, v, want)
			}
		}
		if _, ok := envValue(r.Env, "ANTHROPIC_API_KEY"); !ok {
			t.Error("claude has no ANTHROPIC_API_KEY (it refuses to start without one)")
		}
		// Only the session's MCP servers: the workspace's own .mcp.json could inject others.
		if opts, _ := r.SessionMeta["claudeCode"].(map[string]any)["options"].(map[string]any); opts["strictMcpConfig"] != true {
			t.Errorf("claude session _meta %v, want claudeCode.options.strictMcpConfig true", r.SessionMeta)
		}
		if _, ok := envValue(r.Env, "IS_SANDBOX"); ok != (os.Geteuid() == 0) {
			t.Errorf("claude IS_SANDBOX set %v as uid %d", ok, os.Geteuid())
		}
	}

	home := t.TempDir()
	r, err := in.ACP(agents.Codex, agents.ACPOptions{Home: home, ModelURL: url})
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := os.ReadFile(filepath.Join(home, ".codex", "config.toml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`model = "fake-model"`, `approval_policy = "on-request"`, `sandbox_mode = "workspace-write"`,
		`base_url = "` + url + `"`, `wire_api = "responses"`, "[features]\nplugins = false", "tool_suggest = false", "[analytics]\nenabled = false"} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("codex config.toml lacks %q:\n%s", want, cfg)
		}
	}
	if r.SessionMeta != nil {
		t.Errorf("codex session _meta %v, want none", r.SessionMeta)
	}
	if v, _ := envValue(r.Env, "CODEX_HOME"); v != filepath.Join(home, ".codex") {
		t.Errorf("CODEX_HOME=%q", v)
	}

	r, err = in.ACP(agents.Copilot, agents.ACPOptions{Home: t.TempDir(), ModelURL: url, Yolo: true})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{filepath.Join(tools, "node_modules/@github/copilot-linux-x64/copilot"), "--acp", "--no-auto-update", "--allow-all-tools"}; !slices.Equal(r.Argv, want) {
		t.Errorf("copilot argv %q, want %q", r.Argv, want)
	}
	for name, want := range map[string]string{
		"COPILOT_PROVIDER_BASE_URL": url, "COPILOT_PROVIDER_TYPE": "openai", "COPILOT_MODEL": "fake-model",
		"COPILOT_OFFLINE": "true", "XDG_CACHE_HOME": in.CacheDir(),
	} {
		if v, _ := envValue(r.Env, name); v != want {
			t.Errorf("copilot %s=%q, want %q", name, v, want)
		}
	}
	for _, leak := range []string{"OPENAI_API_KEY", "GITHUB_TOKEN"} {
		for _, env := range [][]string{r.Env} {
			if _, ok := envValue(env, leak); ok {
				t.Errorf("%s reaches the agent", leak)
			}
		}
	}

	for _, k := range []agents.Kind{agents.Claude, agents.Codex, agents.Copilot} {
		if _, err := in.ACP(k, agents.ACPOptions{Home: t.TempDir(), ModelURL: url, Instructions: "be brief"}); !errors.Is(err, agents.ErrUnsupported) {
			t.Errorf("%s with instructions: %v, want ErrUnsupported", k, err)
		}
	}
	// copilot runs a repository's hooks whatever its home says: not started where there are some,
	// in the workspace or at the root of the git repository it is in.
	repo := t.TempDir()
	ws := filepath.Join(repo, "sub", "ws")
	if err := os.MkdirAll(filepath.Join(ws, ".github"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := in.ACP(agents.Copilot, agents.ACPOptions{Home: t.TempDir(), ModelURL: url, Workspace: ws}); err != nil {
		t.Errorf("copilot in a workspace without hooks: %v", err)
	}
	for _, dir := range []string{ws, repo} {
		hooks := filepath.Join(dir, ".github", "hooks")
		if err := os.MkdirAll(filepath.Join(repo, ".git"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(hooks, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(hooks, "x.json"), []byte(`{"version":1}`), 0o644); err != nil {
			t.Fatal(err)
		}
		_, err := in.ACP(agents.Copilot, agents.ACPOptions{Home: t.TempDir(), ModelURL: url, Workspace: ws})
		if !errors.Is(err, agents.ErrWorkspaceConfig) || !strings.Contains(err.Error(), hooks) {
			t.Errorf("copilot with hooks in %s: %v, want ErrWorkspaceConfig naming them", hooks, err)
		}
		if err := os.RemoveAll(hooks); err != nil {
			t.Fatal(err)
		}
	}

	if _, err := in.ACP("nope", agents.ACPOptions{Home: t.TempDir()}); !errors.Is(err, agents.ErrNoRecipe) {
		t.Errorf("ACP(nope): %v, want ErrNoRecipe", err)
	}
	if err := os.Remove(filepath.Join(tools, "node_modules/@github/copilot-linux-x64/copilot")); err != nil {
		t.Fatal(err)
	}
	if _, err := in.ACP(agents.Copilot, agents.ACPOptions{Home: t.TempDir(), ModelURL: url}); !errors.Is(err, agents.ErrNotFound) {
		t.Errorf("copilot without its binary: %v, want ErrNotFound", err)
	}
}

// A confined copilot cannot write the shared cache it unpacks itself into on its first start: the
// recipe unpacks it first (unconfined), once, and says so when that fails.
func TestInstall_CopilotConfinedUnpacksFirst(t *testing.T) {
	tools := fakeACPTools(t)
	bin := filepath.Join(tools, "node_modules/@github/copilot-linux-x64/copilot")
	pkg := filepath.Join(tools, "cache", "copilot", "pkg", "linux-x64", "1.0.102")
	count := filepath.Join(t.TempDir(), "runs")
	script := "#!/bin/sh\necho run >> " + count + "\n[ \"$1\" = --version ] && mkdir -p \"$XDG_CACHE_HOME/copilot/pkg/linux-x64/1.0.102\"\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	in := &agents.Install{Dir: tools}
	if _, err := in.ACP(agents.Copilot, agents.ACPOptions{Home: t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pkg); err == nil {
		t.Fatal("an unconfined copilot's recipe unpacked it (its own start does)")
	}
	for range 2 {
		if _, err := in.ACP(agents.Copilot, agents.ACPOptions{Home: t.TempDir(), Confined: true}); err != nil {
			t.Fatal(err)
		}
	}
	if runs, _ := os.ReadFile(count); string(runs) != "run\n" {
		t.Fatalf("copilot ran %q to unpack: want once", runs)
	}
	if err := os.RemoveAll(filepath.Join(tools, "cache")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho no space left >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := in.ACP(agents.Copilot, agents.ACPOptions{Home: t.TempDir(), Confined: true}); err == nil || !strings.Contains(err.Error(), "no space left") {
		t.Fatalf("a failed unpack: %v", err)
	}
}

// codex's bubblewrap cannot start inside Landlock: confined and yolo, codex runs its commands without
// its own sandbox; confined and asking, it keeps it (a command it cannot sandbox asks to escalate).
func TestInstall_CodexConfined(t *testing.T) {
	tools := fakeACPTools(t)
	pathDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(pathDir, "node"), []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", pathDir)
	in := &agents.Install{Dir: tools}
	for _, tc := range []struct {
		yolo, confined bool
		sandbox, mode  string
	}{
		{false, false, "workspace-write", "workspace-write"},
		{false, true, "workspace-write", "workspace-write"},
		{true, false, "workspace-write", "workspace-write"},
		{true, true, "danger-full-access", "agent-full-access"},
	} {
		home := t.TempDir()
		r, err := in.ACP(agents.Codex, agents.ACPOptions{Home: home, Yolo: tc.yolo, Confined: tc.confined})
		if err != nil {
			t.Fatal(err)
		}
		cfg, _ := os.ReadFile(filepath.Join(home, ".codex", "config.toml"))
		if mode, _ := envValue(r.Env, "INITIAL_AGENT_MODE"); !strings.Contains(string(cfg), `sandbox_mode = "`+tc.sandbox+`"`) || mode != tc.mode {
			t.Errorf("yolo %v confined %v: mode %q, config:\n%s", tc.yolo, tc.confined, mode, cfg)
		}
	}
}
