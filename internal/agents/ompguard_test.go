package agents_test

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/agents"
)

func TestOMPOverlayText(t *testing.T) {
	for _, tc := range []struct {
		o       agents.OMPOverlay
		enabled []string
		lspOff  bool
	}{
		{agents.OMPOverlay{}, []string{}, false},
		{agents.OMPOverlay{MCP: true, Ask: true, BuiltinModel: true}, []string{"windsurf"}, true},
	} {
		var got struct {
			DisabledProviders []string        `json:"disabledProviders"`
			EnabledProviders  []string        `json:"enabledProviders"`
			LSP               map[string]bool `json:"lsp"`
		}
		if err := json.Unmarshal([]byte(agents.OMPOverlayText(tc.o)), &got); err != nil {
			t.Fatal(err)
		}
		// Every provider that loads code, commands or settings from the workspace or the home.
		for _, p := range []string{"native", "claude", "codex", "cursor", "gemini", "opencode", "claude-plugins", "omp-plugins", "agent-plugins"} {
			if !slices.Contains(got.DisabledProviders, p) {
				t.Errorf("%+v: %s not disabled: %v", tc.o, p, got.DisabledProviders)
			}
		}
		// A list, even empty: it replaces what the home's settings opted in.
		if got.EnabledProviders == nil || !slices.Equal(got.EnabledProviders, tc.enabled) {
			t.Errorf("%+v: enabledProviders %v, want %v", tc.o, got.EnabledProviders, tc.enabled)
		}
		if off := got.LSP != nil && !got.LSP["enabled"]; off != tc.lspOff {
			t.Errorf("%+v: lsp %v", tc.o, got.LSP)
		}
	}
	if args := agents.OMPWorkspaceArgs("always-ask", "/o"); !slices.Contains(args, "--no-lsp") || !slices.Contains(args, "--no-extensions") {
		t.Errorf("always-ask: %q", args)
	}
	if args := agents.OMPWorkspaceArgs("yolo", "/o"); slices.Contains(args, "--no-lsp") {
		t.Errorf("yolo: %q", args)
	}
}

// TestCheckOMPWorkspace: omp loads the plugins of the nearest .omp folder above its workspace (or
// of the git root's), which nothing switches off; a room that asks refuses them, naming the folder.
func TestCheckOMPWorkspace(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant map[string]string
		ws    string // the workspace, relative
		bad   string // the folder named, relative ("" accepted)
	}{
		{"nothing", map[string]string{"ws/a.txt": "x"}, "ws", ""},
		{"project settings only", map[string]string{"ws/.omp/config.yml": "x"}, "ws", ""},
		{"plugins", map[string]string{"ws/.omp/plugins/node_modules/p/package.json": "{}"}, "ws", "ws/.omp/plugins/node_modules"},
		{"plugins of a parent's .omp", map[string]string{"repo/.omp/plugins/node_modules/p/package.json": "{}", "repo/sub/a": "x"}, "repo/sub", "repo/.omp/plugins/node_modules"},
		{"the nearest .omp wins", map[string]string{"repo/.omp/plugins/node_modules/p/package.json": "{}", "repo/sub/.omp/x": "x"}, "repo/sub", ""},
		{"the git root's", map[string]string{"repo/.git/HEAD": "x", "repo/.omp/plugins/node_modules/p/package.json": "{}", "repo/sub/a": "x"}, "repo/sub", "repo/.omp/plugins/node_modules"},
		{"a plugins file, not a folder", map[string]string{"ws/.omp/plugins": "x"}, "ws", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			plantHome(t, root, tc.plant)
			err := agents.CheckOMPWorkspace(filepath.Join(root, tc.ws), filepath.Join(root, "home"))
			if tc.bad == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, agents.ErrOMPPlugins) || !errors.Is(err, agents.ErrWorkspaceConfig) || !strings.Contains(err.Error(), filepath.Join(root, tc.bad)) {
				t.Fatalf("err %v, want ErrOMPPlugins naming %s", err, tc.bad)
			}
		})
	}
	if err := agents.CheckOMPWorkspace(filepath.Join(t.TempDir(), "missing"), "/home"); err != nil {
		t.Fatal(err)
	}
}
