package agents_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"go.uber.org/goleak"

	"github.com/agenthost/agenthost/internal/agents"
)

// TestMain checks that no test, including the real-agent one, leaves goroutines behind.
func TestMain(m *testing.M) {
	if home := os.Getenv(resetHelperEnv); home != "" {
		// As the agent's own user (resetAsAgentsUser): reset its home.
		if err := agents.ResetHome(home, agents.Kind(os.Getenv(resetKindEnv)), nil); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// fakeTools builds a tools folder laid out like the real one, with stub files.
func fakeTools(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), ".tools")
	files := map[string]string{
		"node_modules/@oh-my-pi/pi-coding-agent/package.json":     `{"name":"@oh-my-pi/pi-coding-agent","version":"18.2.3"}`,
		"node_modules/@oh-my-pi/pi-coding-agent/dist/cli.js":      "",
		"node_modules/@mariozechner/pi-coding-agent/package.json": `{"name":"@mariozechner/pi-coding-agent","version":"0.73.1"}`,
		"node_modules/@mariozechner/pi-coding-agent/dist/cli.js":  "",
		"node_modules/bun/package.json":                           `{"name":"bun","version":"1.3.14"}`,
		"node_modules/bun/bin/bun.exe":                            "#!/bin/sh\n",
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
	bin := filepath.Join(dir, "node_modules", ".bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../bun/bin/bun.exe", filepath.Join(bin, "bun")); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestFind_Env(t *testing.T) {
	tools := fakeTools(t)
	t.Setenv(agents.ToolsEnv, tools)
	in, err := agents.Find()
	if err != nil || in.Dir != tools {
		t.Fatalf("Find = %+v, %v; want %s", in, err, tools)
	}

	t.Setenv(agents.ToolsEnv, t.TempDir())
	_, err = agents.Find()
	if !errors.Is(err, agents.ErrNotFound) || !strings.Contains(err.Error(), "make setup") {
		t.Errorf("Find with empty %s: %v", agents.ToolsEnv, err)
	}
}

func TestFind_WalksUp(t *testing.T) {
	tools := fakeTools(t)
	deep := filepath.Join(filepath.Dir(tools), "a", "b", "c")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(agents.ToolsEnv, "")
	t.Chdir(deep)
	in, err := agents.Find()
	if err != nil || in.Dir != tools {
		t.Fatalf("Find = %+v, %v; want %s", in, err, tools)
	}
}

func TestFind_Missing(t *testing.T) {
	t.Setenv(agents.ToolsEnv, "")
	t.Chdir(t.TempDir())
	in, err := agents.Find()
	if err == nil {
		// The test binary's own directory may sit inside a checkout with .tools.
		t.Skipf("found %s from the executable's directory", in.Dir)
	}
	if !errors.Is(err, agents.ErrNotFound) || !strings.Contains(err.Error(), "make setup") || !strings.Contains(err.Error(), ".tools/node_modules") {
		t.Errorf("Find: %v", err)
	}
}

func TestInstall_ArgvAndVersions(t *testing.T) {
	tools := fakeTools(t)
	pathDir := t.TempDir()
	node := filepath.Join(pathDir, "node")
	if err := os.WriteFile(node, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", pathDir)
	in := &agents.Install{Dir: tools}

	argv, err := in.Argv(agents.OMP)
	// Bun reads no bunfig.toml (whose preload modules would run before omp) and no .env.
	wantOMP := []string{filepath.Join(tools, "node_modules/.bin/bun"), "--config=/dev/null", "--no-env-file",
		filepath.Join(tools, "node_modules/@oh-my-pi/pi-coding-agent/dist/cli.js")}
	if err != nil || !slices.Equal(argv, wantOMP) {
		t.Errorf("Argv(OMP) = %q, %v; want %q", argv, err, wantOMP)
	}
	argv, err = in.Argv(agents.Pi)
	wantPi := []string{node, filepath.Join(tools, "node_modules/@mariozechner/pi-coding-agent/dist/cli.js")}
	if err != nil || !slices.Equal(argv, wantPi) {
		t.Errorf("Argv(Pi) = %q, %v; want %q", argv, err, wantPi)
	}
	for k, want := range map[agents.Kind]string{agents.OMP: "18.2.3", agents.Pi: "0.73.1"} {
		if v, err := in.Version(k); v != want || err != nil {
			t.Errorf("Version(%s) = %q, %v; want %q", k, v, err, want)
		}
	}
	if v, err := in.BunVersion(); v != "1.3.14" || err != nil {
		t.Errorf("BunVersion = %q, %v", v, err)
	}
	if _, err := in.Argv("claude"); !errors.Is(err, agents.ErrKind) {
		t.Errorf("Argv(claude): %v, want ErrKind", err)
	}

	// Missing pieces are reported as ErrNotFound.
	t.Setenv("PATH", t.TempDir())
	if _, err := in.Argv(agents.Pi); !errors.Is(err, agents.ErrNotFound) {
		t.Errorf("Argv(Pi) without node: %v", err)
	}
	if err := os.Remove(filepath.Join(tools, "node_modules/bun/bin/bun.exe")); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Argv(agents.OMP); !errors.Is(err, agents.ErrNotFound) {
		t.Errorf("Argv(OMP) without bun: %v", err)
	}
	if err := os.RemoveAll(filepath.Join(tools, "node_modules/@mariozechner")); err != nil {
		t.Fatal(err)
	}
	if _, err := in.Version(agents.Pi); !errors.Is(err, agents.ErrNotFound) {
		t.Errorf("Version(Pi) without the package: %v", err)
	}
}

// TestInstall_Real checks the versions agenthost pins, when the real install is present.
func TestInstall_Real(t *testing.T) {
	in, err := agents.Find()
	if err != nil {
		t.Skipf("agents not installed: %v", err)
	}
	for k, want := range map[agents.Kind]string{agents.OMP: "18.2.3", agents.Pi: "0.73.1"} {
		if v, err := in.Version(k); v != want || err != nil {
			t.Errorf("Version(%s) = %q, %v; want %q", k, v, err, want)
		}
		argv, err := in.Argv(k)
		if err != nil || len(argv) < 2 || !filepath.IsAbs(argv[0]) || !filepath.IsAbs(argv[len(argv)-1]) {
			t.Errorf("Argv(%s) = %q, %v", k, argv, err)
		}
	}
	if v, err := in.BunVersion(); v == "" || err != nil {
		t.Errorf("BunVersion = %q, %v", v, err)
	}
}

func TestHome(t *testing.T) {
	t.Setenv("OPENAI_API_KEY", "sk-secret")
	t.Setenv("GITHUB_TOKEN", "ghp-secret")
	t.Setenv("PI_CODING_AGENT_DIR", "/elsewhere")
	t.Setenv("OMP_AUTH_BROKER_URL", "https://broker")
	t.Setenv("XDG_DATA_HOME", "/elsewhere/data")
	t.Setenv("NO_PROXY", "corp.example")
	t.Setenv("AGENTHOST_KEEP_ME", "yes")
	const url = "http://127.0.0.1:4321/v1"

	tests := []struct {
		kind  agents.Kind
		api   string
		file  string
		extra map[string]string // fields expected on the provider
	}{
		{agents.OMP, "", ".omp/agent/models.yml", map[string]string{"auth": "none", "api": "openai-completions"}},
		{agents.OMP, agents.APIResponses, ".omp/agent/models.yml", map[string]string{"auth": "none", "api": "openai-responses"}},
		{agents.Pi, "", ".pi/agent/models.json", map[string]string{"api": "openai-completions"}},
		{agents.Pi, agents.APIResponses, ".pi/agent/models.json", map[string]string{"api": "openai-responses"}},
	}
	for _, tc := range tests {
		t.Run(string(tc.kind)+"/"+tc.api, func(t *testing.T) {
			dir := t.TempDir()
			env, err := agents.HomeWith(dir, tc.kind, url, agents.HomeOptions{API: tc.api})
			if err != nil {
				t.Fatal(err)
			}
			// models.yml is written as JSON, which YAML parsers accept.
			data, err := os.ReadFile(filepath.Join(dir, tc.file))
			if err != nil {
				t.Fatal(err)
			}
			var cfg struct {
				Providers map[string]map[string]any
			}
			if err := json.Unmarshal(data, &cfg); err != nil {
				t.Fatal(err)
			}
			p := cfg.Providers["fake"]
			if p == nil || p["baseUrl"] != url {
				t.Fatalf("provider = %v", cfg.Providers)
			}
			for k, v := range tc.extra {
				if p[k] != v {
					t.Errorf("provider[%s] = %v, want %v", k, p[k], v)
				}
			}
			if tc.kind == agents.Pi && p["apiKey"] == "" {
				t.Error("pi provider needs a non-empty apiKey")
			}
			models, _ := p["models"].([]any)
			if len(models) != 1 || models[0].(map[string]any)["id"] != "fake-model" {
				t.Errorf("models = %v", models)
			}
			// The model is priced, so the agents report a cost above zero.
			if len(models) == 1 {
				cost, _ := models[0].(map[string]any)["cost"].(map[string]any)
				want := map[string]any{"input": agents.PriceInput, "output": agents.PriceOutput,
					"cacheRead": agents.PriceCacheRead, "cacheWrite": agents.PriceCacheWrite}
				for k, v := range want {
					if cost[k] != v || v.(float64) <= 0 {
						t.Errorf("cost[%s] = %v, want %v", k, cost[k], v)
					}
				}
			}
			if agents.ModelID != "fake/fake-model" {
				t.Errorf("ModelID = %q", agents.ModelID)
			}

			vars := map[string]string{}
			for _, kv := range env {
				k, v, _ := strings.Cut(kv, "=")
				if _, dup := vars[k]; dup {
					t.Errorf("%s set twice", k)
				}
				vars[k] = v
			}
			for k, want := range map[string]string{
				"HOME": dir, "PI_OFFLINE": "1", "PI_TELEMETRY": "0", "PI_AUTO_QA": "0",
				"NO_PROXY": "corp.example,127.0.0.1,localhost",
			} {
				if vars[k] != want {
					t.Errorf("%s = %q, want %q", k, vars[k], want)
				}
			}
			for _, k := range []string{"OPENAI_API_KEY", "GITHUB_TOKEN", "OMP_AUTH_BROKER_URL", "AGENTHOST_KEEP_ME"} {
				if _, ok := vars[k]; ok {
					t.Errorf("%s leaked into the agent environment", k)
				}
			}
			// What moves the agent's folders is the home's own (omp's pinned) or absent (pi's:
			// piext sets its own), never the server's.
			for _, k := range []string{"PI_CODING_AGENT_DIR", "XDG_DATA_HOME"} {
				if v, ok := vars[k]; ok && (tc.kind != agents.OMP || !strings.HasPrefix(v, dir+"/")) {
					t.Errorf("%s = %q in a %s home at %s", k, v, tc.kind, dir)
				}
			}
		})
	}
}

func TestHome_OMPConfig(t *testing.T) {
	dir := t.TempDir()
	if _, err := agents.Home(dir, agents.OMP, "http://127.0.0.1:1/v1"); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, ".omp/agent/config.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		DisabledProviders []string `json:"disabledProviders"`
		Startup           struct {
			CheckUpdate *bool `json:"checkUpdate"`
		} `json:"startup"`
	}
	if err := json.Unmarshal(data, &cfg); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cfg.DisabledProviders, "ollama") || cfg.Startup.CheckUpdate == nil || *cfg.Startup.CheckUpdate {
		t.Errorf("config.yml = %s", data)
	}
}

func TestHome_Errors(t *testing.T) {
	t.Parallel()
	if _, err := agents.HomeWith(t.TempDir(), agents.OMP, "http://x/v1", agents.HomeOptions{API: "anthropic-messages"}); !errors.Is(err, agents.ErrAPI) {
		t.Errorf("bad API: %v", err)
	}
	if _, err := agents.Home(t.TempDir(), "claude", "http://x/v1"); !errors.Is(err, agents.ErrKind) {
		t.Errorf("bad kind: %v", err)
	}
	if _, err := agents.Home(t.TempDir(), agents.Pi, ""); err == nil {
		t.Error("empty URL accepted")
	}
}
