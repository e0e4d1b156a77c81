package agents_test

import (
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agenthost/agenthost/internal/agents"
)

// TestACPRecipe_OMP checks that omp acp runs with the room's approval mode pinned on its command
// line and the workspace's own configuration switched off (overlay, --no-extensions).
func TestACPRecipe_OMP(t *testing.T) {
	in := &agents.Install{Dir: fakeTools(t)}
	home := filepath.Join(t.TempDir(), "home")
	for _, tc := range []struct {
		opts agents.ACPOptions
		mode string
	}{
		{agents.ACPOptions{Home: home, ModelURL: "http://127.0.0.1:9/v1", Yolo: true}, "yolo"},
		{agents.ACPOptions{Home: home, ModelURL: "http://127.0.0.1:9/v1"}, "always-ask"},
		{agents.ACPOptions{Home: home}, "always-ask"},
	} {
		r, err := in.ACP(agents.OMP, tc.opts)
		if err != nil {
			t.Fatal(err)
		}
		overlay := filepath.Join(home, agents.OMPOverlayName)
		i := slices.Index(r.Argv, "acp")
		want := []string{"acp", "--approval-mode", tc.mode, "--config", overlay, "--no-extensions"}
		if tc.mode != "yolo" {
			// The language servers the workspace names or carries are commands too.
			want = append(want, "--no-lsp")
		}
		if i < 0 || !slices.Equal(r.Argv[i:], want) {
			t.Fatalf("argv %q, want it to end %q", r.Argv, want)
		}
		// Bun and omp read bunfig.toml and .env from the process's folder, not the workspace.
		if pkg, _ := in.PackageDir(agents.OMP); r.Dir != pkg {
			t.Fatalf("omp acp starts in %q, want its package folder %q", r.Dir, pkg)
		}
		var o struct {
			MCP struct {
				EnableProjectConfig *bool `json:"enableProjectConfig"`
			} `json:"mcp"`
			DisabledProviders []string `json:"disabledProviders"`
			Tools             struct {
				Approval []any `json:"approval"`
			} `json:"tools"`
		}
		data, err := os.ReadFile(overlay)
		if err != nil || json.Unmarshal(data, &o) != nil {
			t.Fatalf("overlay: %s %v", data, err)
		}
		if o.MCP.EnableProjectConfig == nil || *o.MCP.EnableProjectConfig || o.Tools.Approval == nil {
			t.Fatalf("overlay %s: want mcp.enableProjectConfig false and tools.approval a list", data)
		}
		for _, p := range []string{"native", "claude", "codex", "omp-plugins", "claude-plugins", "agent-plugins", "cursor", "gemini", "opencode"} {
			if !slices.Contains(o.DisabledProviders, p) {
				t.Errorf("overlay disables %v, not %s", o.DisabledProviders, p)
			}
		}
		// The home's list of local model servers is replaced by the overlay's: kept off on the
		// built-in model, left to the user otherwise.
		if got := slices.Contains(o.DisabledProviders, "ollama"); got != (tc.opts.ModelURL != "") {
			t.Errorf("model URL %q: ollama disabled %v", tc.opts.ModelURL, got)
		}
		if tc.opts.ModelURL != "" && (r.Model != agents.ModelID || !slices.Contains(r.Env, "HOME="+home)) {
			t.Fatalf("model %q env has HOME: %v", r.Model, slices.Contains(r.Env, "HOME="+home))
		}
	}
	if _, err := os.Stat(filepath.Join(home, ".omp", "agent", "models.yml")); err != nil {
		t.Fatalf("the home does not point at the model: %v", err)
	}
}

func TestACPRecipe_Unknown(t *testing.T) {
	in := &agents.Install{Dir: fakeTools(t)}
	if _, err := in.ACP("nope", agents.ACPOptions{Home: t.TempDir()}); !errors.Is(err, agents.ErrNoRecipe) {
		t.Fatalf("err %v", err)
	}
}
