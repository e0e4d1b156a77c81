package agents_test

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/agents"
)

// plantHome writes files (relative path → content) into home; a content starting with "->" makes
// a symlink to the rest.
func plantHome(t *testing.T, home string, files map[string]string) {
	t.Helper()
	for rel, content := range files {
		p := filepath.Join(home, filepath.FromSlash(rel))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if target, ok := strings.CutPrefix(content, "->"); ok {
			if err := os.Symlink(target, p); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestResetHome plants in an agent's home what the agent must never set there, beside what it may
// keep, and checks what is left after a reset: the file's content ("" gone, "=" unchanged).
func TestResetHome(t *testing.T) {
	outside := t.TempDir()
	victim := filepath.Join(outside, "victim.txt")
	if err := os.WriteFile(victim, []byte("another room's file"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(outside, "omp", "agent"), 0o700); err != nil {
		t.Fatal(err)
	}
	const session = `{"type":"session"}` + "\n"
	tests := []struct {
		kind   agents.Kind
		plant  map[string]string
		expect map[string]string
	}{
		{agents.OMP, map[string]string{
			".omp/agent/tools/evil.ts":         "module",
			".omp/agent/extensions/evil.ts":    "module",
			".omp/agent/hooks/pre/bash.ts":     "module",
			".omp/agent/commands/x.ts":         "module",
			".omp/plugins/node_modules/p/i.ts": "module",
			".omp/agent/config.yml":            "shellPath: /evil.sh\n",
			".omp/agent/settings.json":         `{"shellPath":"/evil.sh"}`,
			".omp/agent/agent.db":              "credentials with !commands",
			".omp/agent/mcp.json":              `{"mcpServers":{"x":{"command":"evil"}}}`,
			".omp/agent/.env":                  "XDG_DATA_HOME=.",
			".omp/.env":                        "XDG_DATA_HOME=.",
			".omp/agent/lsp.json":              `{"servers":{}}`,
			".env":                             "LD_PRELOAD=./evil.so",
			"bunfig.toml":                      `preload = ["./evil.ts"]`,
			".bashrc":                          "touch /tmp/evil",
			".zshrc":                           "touch /tmp/evil",
			".local/share/omp/plugins/x":       "module",
			".cache/omp/x":                     "x",
			".omp/agent/memories/m.md":         "the agent's memory",
			".omp/agent/blobs/ab":              "blob",
			".omp/agent/history.db":            "history",
			".omp/logs/omp.log":                "log",
			"sessions/s.jsonl":                 session,
			".omp/agent/models.yml":            "providers:\n  p:\n    apiKey: '!touch /tmp/evil'\n    baseUrl: http://x\n",
			"notes.txt":                        "the agent's own file",
			".omp/agent/memories/link-out":     "->" + victim,
			".local/state":                     "->" + outside,
		}, map[string]string{
			".omp/agent/tools/evil.ts": "", ".omp/agent/extensions/evil.ts": "", ".omp/agent/hooks/pre/bash.ts": "",
			".omp/agent/commands/x.ts": "", ".omp/plugins/node_modules/p/i.ts": "", ".omp/agent/config.yml": "",
			".omp/agent/settings.json": "", ".omp/agent/agent.db": "", ".omp/agent/mcp.json": "", ".omp/agent/.env": "",
			".omp/.env": "", ".omp/agent/lsp.json": "", ".env": "", "bunfig.toml": "", ".bashrc": "", ".zshrc": "",
			".local/share/omp/plugins/x": "", ".cache/omp/x": "",
			".omp/agent/memories/m.md": "=", ".omp/agent/blobs/ab": "=", ".omp/agent/history.db": "=",
			".omp/logs/omp.log": "=", "sessions/s.jsonl": "=", "notes.txt": "=",
			".omp/agent/models.yml": "{\n  \"providers\": {\n    \"p\": {\n      \"baseUrl\": \"http://x\"\n    }\n  }\n}\n",
		}},
		{agents.Pi, map[string]string{
			".pi/agent/settings.json": `{"shellCommandPrefix":"touch /tmp/evil;","packages":["npm:x"],"npmCommand":["sh"],` +
				`"extensions":["/x.ts"],"shellPath":"/evil","defaultModel":"m","theme":"dark"}`,
			".pi/agent/auth.json":       `{"fake":{"type":"api_key","key":"!touch /tmp/evil"},"openai":{"type":"api_key","key":"sk-x"}}`,
			".pi/agent/models.json":     `{"providers":{"p":{"apiKey":"!cat /key","headers":{"X":"!id","Y":"y"}}}}`,
			".pi/agent/bin/rg":          "#!/bin/sh\ntouch /tmp/evil",
			".pi/agent/extensions/x.ts": "module",
			".pi/agent/SYSTEM.md":       "the agent's memory",
			"sessions/s.jsonl":          session,
			".pi/agent/prompts/p.md":    "a prompt",
			"agenthost-pi/agenthost.ts": "=",
		}, map[string]string{
			".pi/agent/settings.json": "{\n  \"defaultModel\": \"m\",\n  \"theme\": \"dark\"\n}\n",
			".pi/agent/auth.json":     "{\n  \"openai\": {\n    \"key\": \"sk-x\",\n    \"type\": \"api_key\"\n  }\n}\n",
			".pi/agent/models.json":   "{\n  \"providers\": {\n    \"p\": {\n      \"headers\": {\n        \"Y\": \"y\"\n      }\n    }\n  }\n}\n",
			".pi/agent/bin/rg":        "", ".pi/agent/extensions/x.ts": "",
			".pi/agent/SYSTEM.md": "=", "sessions/s.jsonl": "=", ".pi/agent/prompts/p.md": "=",
		}},
	}
	for _, tc := range tests {
		t.Run(string(tc.kind), func(t *testing.T) {
			home := t.TempDir()
			plantHome(t, home, tc.plant)
			if err := agents.ResetHome(home, tc.kind, nil); err != nil {
				t.Fatal(err)
			}
			for rel, want := range tc.expect {
				data, err := os.ReadFile(filepath.Join(home, filepath.FromSlash(rel)))
				switch {
				case want == "" && err == nil:
					t.Errorf("%s is still there: %q", rel, data)
				case want == "":
				case err != nil:
					t.Errorf("%s: %v", rel, err)
				case want == "=" && string(data) != tc.plant[rel]:
					t.Errorf("%s changed: %q", rel, data)
				case want != "=" && string(data) != want:
					t.Errorf("%s = %q, want %q", rel, data, want)
				}
			}
			// Links are removed or kept as links, never followed: what they name is untouched.
			if data, err := os.ReadFile(victim); err != nil || string(data) != "another room's file" {
				t.Fatalf("the file a link named: %q, %v", data, err)
			}
			if _, err := os.Stat(filepath.Join(outside, "omp", "agent")); err != nil {
				t.Fatalf("a folder a link named was removed: %v", err)
			}
			// A second reset changes nothing more.
			if err := agents.ResetHome(home, tc.kind, nil); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestResetHome_Links: the folders on the way to what the reset rewrites may be links the agent
// planted; the reset removes the link and writes nothing through it.
func TestResetHome_Links(t *testing.T) {
	outside := t.TempDir()
	settings := `{"shellCommandPrefix":"x"}`
	plantHome(t, outside, map[string]string{"agent/settings.json": settings, ".pi/agent/settings.json": settings,
		"agent/tools/t.ts": "keep", "share/omp/x": "keep"})
	home := t.TempDir()
	plantHome(t, home, map[string]string{".pi": "->" + outside, ".omp": "->" + outside, ".local/share": "->" + filepath.Join(outside, "share")})
	for _, k := range []agents.Kind{agents.OMP, agents.Pi} {
		if err := agents.ResetHome(home, k, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, rel := range []string{"agent/settings.json", ".pi/agent/settings.json", "agent/tools/t.ts", "share/omp/x"} {
		data, err := os.ReadFile(filepath.Join(outside, rel))
		if err != nil || (string(data) != settings && string(data) != "keep") {
			t.Errorf("%s outside the home: %q, %v", rel, data, err)
		}
	}
	for _, rel := range []string{".pi", ".omp"} {
		if _, err := os.Lstat(filepath.Join(home, rel)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the link %s is still in the home: %v", rel, err)
		}
	}
}

// TestSeedHome: a prompt's throwaway home gets the user's settings, models and credentials,
// without commands, code or anything else of the user's folder.
func TestSeedHome(t *testing.T) {
	user := t.TempDir()
	plantHome(t, user, map[string]string{
		"omp/config.yml":     "extensions: [/x.ts]\ntheme: dark\n",
		"omp/models.yml":     "providers:\n  p:\n    apiKey: '!pass show key'\n    baseUrl: http://x\n",
		"omp/tools/evil.ts":  "module",
		"pi/settings.json":   `{"packages":["npm:x"],"defaultModel":"m"}`,
		"pi/auth.json":       `{"a":{"type":"api_key","key":"!op read"},"b":{"type":"oauth","access":"t"}}`,
		"pi/extensions/x.ts": "module",
		"pi/bin/rg":          "binary",
	})
	home := t.TempDir()
	if err := agents.SeedHome(home, agents.OMP, filepath.Join(user, "omp")); err != nil {
		t.Fatal(err)
	}
	if err := agents.SeedHome(home, agents.Pi, filepath.Join(user, "pi")); err != nil {
		t.Fatal(err)
	}
	read := func(rel string) map[string]any {
		data, err := os.ReadFile(filepath.Join(home, rel))
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(data, &m); err != nil {
			t.Fatalf("%s: %v", rel, err)
		}
		return m
	}
	if m := read(".omp/agent/config.yml"); m["theme"] != "dark" || m["extensions"] != nil {
		t.Errorf("omp settings %v", m)
	}
	if m := read(".omp/agent/models.yml"); strings.Contains(mustJSON(m), "pass show") || !strings.Contains(mustJSON(m), "http://x") {
		t.Errorf("omp models %v", m)
	}
	if m := read(".pi/agent/settings.json"); m["defaultModel"] != "m" || m["packages"] != nil {
		t.Errorf("pi settings %v", m)
	}
	if m := read(".pi/agent/auth.json"); m["a"] != nil || m["b"] == nil {
		t.Errorf("pi auth %v", m)
	}
	var left []string
	_ = filepath.WalkDir(home, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, strings.TrimPrefix(p, home+"/"))
		}
		return nil
	})
	slices.Sort(left)
	if want := []string{".omp/agent/config.yml", ".omp/agent/models.yml", ".pi/agent/auth.json", ".pi/agent/settings.json"}; !slices.Equal(left, want) {
		t.Errorf("the throwaway home holds %v, want %v", left, want)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// resetHelperEnv makes the test binary reset the home it names (as kind resetKindEnv) and exit.
const (
	resetHelperEnv = "AGENTS_TEST_RESET_HOME"
	resetKindEnv   = "AGENTS_TEST_RESET_KIND"
)

// TestResetHome_UnwritableFolders: a server that is not root resets a home whose agent (its own
// user) made the folders holding what it planted unwritable or unreadable (mode 0500, 0): the
// reset opens them again, and the agent's start is not stopped by its own folders. Run as uid
// 65534 (a helper under setpriv) where the test runs as root, whose rights would hide it.
func TestResetHome_UnwritableFolders(t *testing.T) {
	for _, kind := range []agents.Kind{agents.OMP, agents.Pi} {
		t.Run(string(kind), func(t *testing.T) {
			home := filepath.Join(t.TempDir(), "home")
			plantHome(t, home, map[string]string{
				".omp/agent/tools/locked/evil.ts": "module", ".omp/plugins/node_modules/p/t.ts": "module",
				".omp/agent/memories/m.md": "memory",
				".pi/agent/bin/rg":         "rg", ".pi/agent/extensions/x/e.ts": "module",
			})
			for _, dir := range []string{".omp/agent/tools/locked", ".omp/plugins", ".pi/agent/bin"} {
				if err := os.Chmod(filepath.Join(home, dir), 0o500); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.Chmod(filepath.Join(home, ".pi/agent/extensions/x"), 0); err != nil {
				t.Fatal(err)
			}
			if os.Geteuid() != 0 {
				if err := agents.ResetHome(home, kind, nil); err != nil {
					t.Fatal(err)
				}
			} else {
				resetAsAgentsUser(t, home, kind)
			}
			gone := map[agents.Kind][]string{agents.OMP: {".omp/agent/tools", ".omp/plugins"}, agents.Pi: {".pi/agent/bin", ".pi/agent/extensions"}}
			for _, rel := range gone[kind] {
				if _, err := os.Lstat(filepath.Join(home, rel)); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s is still there: %v", rel, err)
				}
			}
		})
	}
}

// resetAsAgentsUser chowns home to uid 65534 and resets it as that user.
func resetAsAgentsUser(t *testing.T, home string, kind agents.Kind) {
	t.Helper()
	if err := filepath.WalkDir(filepath.Dir(home), func(p string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(p, 65534, 65534)
	}); err != nil {
		t.Fatal(err)
	}
	// The test's temporary folder must let the helper through.
	for d := filepath.Dir(home); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(exe, 0o755); err != nil {
		t.Fatal(err)
	}
	for d := filepath.Dir(exe); d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		_ = os.Chmod(d, 0o755)
	}
	cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), resetHelperEnv+"="+home, resetKindEnv+"="+string(kind))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the reset as uid 65534: %v: %s", err, out)
	}
}
