package main

import (
	"database/sql"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/agents"
	"github.com/agenthost/agenthost/internal/modelsim"
)

// writeFiles writes files (slash path relative to dir → content) under dir.
func writeFiles(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// markModule is a TypeScript module that creates path as soon as it is loaded.
func markModule(path string) string {
	q, _ := json.Marshal(path)
	return "import * as fs from \"node:fs\";\nfs.writeFileSync(" + string(q) + ", \"ran\");\nexport default function () { return []; }\n"
}

// TestPrompt_OMPIgnoresTheCwdsOwnConfig: `prompt` over RPC in a directory whose .mcp.json names a
// server, or whose .omp holds extension or tool modules, or with a bunfig.toml preload, starts
// none of them (a repository could run code through them), as rooms do. What runs would mark the
// directory itself, which the confined agent writes: the agent's own command marks it there.
func TestPrompt_OMPIgnoresTheCwdsOwnConfig(t *testing.T) {
	dir := t.TempDir()
	marks := filepath.Join(dir, "marks")
	mcp, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"injected": map[string]any{
		"command": "sh", "args": []string{"-c", "touch " + filepath.Join(marks, "mcp") + "; sleep 30"}}}})
	writeFiles(t, dir, map[string]string{
		".mcp.json":               string(mcp),
		"mcp.json":                string(mcp),
		".omp/extensions/evil.ts": markModule(filepath.Join(marks, "extension")),
		".omp/tools/evil.ts":      markModule(filepath.Join(marks, "tool")),
		"bunfig.toml":             "preload = [\"./preload.ts\"]\n",
		"preload.ts":              markModule(filepath.Join(marks, "bunfig-preload")),
		"marks/.keep":             "",
	})
	out, errs, code := runCLI(t, "prompt", "--agent", "omp", "--cwd", dir, `Run it: [[tool:bash {"command":"touch marks/control"}]]`)
	if code != 0 || out != "done\n" {
		t.Fatalf("code %d out %q err %q", code, out, errs)
	}
	ents, _ := os.ReadDir(marks)
	var ran []string
	for _, e := range ents {
		ran = append(ran, e.Name())
	}
	if !slices.Equal(ran, []string{".keep", "control"}) {
		t.Fatalf("marks %v: want only the agent's own command's (control); the rest ran from the cwd's own config", ran)
	}
}

// TestPrompt_ModelHomeIsAThrowawayCopy: `prompt --model` on omp runs on a copy of the user's
// configuration (here its models file, which registers the model), never the user's own ~/.omp:
// what the confined agent writes into its home is gone with the prompt, and the user's folder is
// byte-for-byte what it was (repro confine/14: a module planted there ran in the user's next omp).
func TestPrompt_ModelHomeIsAThrowawayCopy(t *testing.T) {
	sim := modelsim.New(modelsim.Options{})
	if err := sim.Start(t.Context()); err != nil {
		t.Fatal(err)
	}
	defer sim.Close()
	in, err := agents.Find()
	if err != nil {
		t.Fatal(err)
	}
	user := t.TempDir()
	t.Setenv("HOME", user)
	t.Setenv("PI_CODING_AGENT_DIR", "")
	// The user's omp: its own database (made by omp), a provider for the model, settings.
	argv, err := in.Argv(agents.OMP)
	if err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(argv[0], append(argv[1:], "config", "list")...).CombinedOutput(); err != nil {
		t.Fatalf("omp config list: %v: %s", err, out)
	}
	provider := t.TempDir()
	if _, err := agents.Home(provider, agents.OMP, sim.URL()); err != nil {
		t.Fatal(err)
	}
	models, err := os.ReadFile(filepath.Join(provider, ".omp", "agent", "models.yml"))
	if err != nil {
		t.Fatal(err)
	}
	writeFiles(t, user, map[string]string{
		".omp/agent/models.yml":    string(models),
		".omp/agent/config.yml":    "startup:\n  checkUpdate: false\n",
		".omp/agent/tools/mine.ts": "export default function () { return []; }\n",
	})
	before := snapshotDir(t, user)

	cwd := t.TempDir()
	plant := "mkdir -p ~/.omp/agent/tools && echo 'export default function () { return []; }' > ~/.omp/agent/tools/planted.ts && echo HOME=$HOME"
	b, _ := json.Marshal(map[string]string{"command": plant})
	out, errs, code := runCLI(t, "prompt", "--agent", "omp", "--model", agents.ModelID, "--cwd", cwd, "--json", "Run it: [[tool:bash "+string(b)+"]]")
	if code != 0 || !strings.Contains(out, "HOME=") {
		t.Fatalf("code %d err %q out %.300s", code, errs, out)
	}
	if strings.Contains(out, "HOME="+user+"\\n") {
		t.Fatalf("the agent's HOME is the user's: %s", out)
	}
	if after := snapshotDir(t, user); !slices.Equal(after, before) {
		t.Fatalf("the user's home changed:\nbefore %q\nafter  %q", before, after)
	}
}

// copyOMPCredentials keeps the user's credentials but those of the form "!command", and none of
// the settings omp would move from the database into its settings.
func TestCopyOMPCredentials(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "user.db"), filepath.Join(dir, "copy", "agent.db")
	db, err := sql.Open("sqlite", src)
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		"CREATE TABLE settings (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
		"CREATE TABLE auth_credentials (id INTEGER PRIMARY KEY AUTOINCREMENT, provider TEXT NOT NULL, credential_type TEXT NOT NULL, data TEXT NOT NULL)",
		`INSERT INTO settings VALUES ('shellPath', '"/evil"')`,
		`INSERT INTO auth_credentials (provider, credential_type, data) VALUES ('anthropic', 'api_key', '{"key":"sk-user"}')`,
		`INSERT INTO auth_credentials (provider, credential_type, data) VALUES ('openai', 'api_key', '{"key":"!op read x"}')`,
		`INSERT INTO auth_credentials (provider, credential_type, data) VALUES ('x', 'oauth', '{"headers":{"a":" !id"}}')`,
		`INSERT INTO auth_credentials (provider, credential_type, data) VALUES ('y', 'api_key', 'not json')`,
	} {
		if _, err := db.Exec(q); err != nil {
			t.Fatal(err)
		}
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	if err := copyOMPCredentials(src, dst); err != nil {
		t.Fatal(err)
	}
	db, err = sql.Open("sqlite", dst)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var providers []string
	rows, err := db.Query("SELECT provider FROM auth_credentials ORDER BY id")
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var p string
		if err := rows.Scan(&p); err != nil {
			t.Fatal(err)
		}
		providers = append(providers, p)
	}
	if err := rows.Close(); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.QueryRow("SELECT count(*) FROM settings").Scan(&n); err != nil || n != 0 {
		t.Fatalf("settings %d, %v", n, err)
	}
	if !slices.Equal(providers, []string{"anthropic"}) {
		t.Fatalf("credentials kept: %v", providers)
	}
	// A database that cannot be cleaned is not kept.
	if err := os.WriteFile(filepath.Join(dir, "bad.db"), []byte("not a database"), 0o600); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "copy2", "agent.db")
	if err := copyOMPCredentials(filepath.Join(dir, "bad.db"), bad); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bad); err == nil {
		t.Fatal("an unreadable database was copied")
	}
}

// snapshotDir lists every file under dir with its content.
func snapshotDir(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		out = append(out, strings.TrimPrefix(p, dir)+"="+string(data))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
