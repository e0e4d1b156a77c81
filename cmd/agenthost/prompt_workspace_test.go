package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// TestPrompt_OMPIgnoresTheCwdsOwnConfig: `prompt` over RPC in a directory
// whose .mcp.json names a server, or whose .omp holds an extension module,
// starts neither (a repository could run code through them), as rooms do.
func TestPrompt_OMPIgnoresTheCwdsOwnConfig(t *testing.T) {
	dir := t.TempDir()
	marks := t.TempDir()
	mcp, _ := json.Marshal(map[string]any{"mcpServers": map[string]any{"injected": map[string]any{
		"command": "sh", "args": []string{"-c", "touch " + filepath.Join(marks, "mcp") + "; sleep 30"}}}})
	q, _ := json.Marshal(filepath.Join(marks, "extension"))
	files := map[string]string{
		".mcp.json":               string(mcp),
		"mcp.json":                string(mcp),
		".omp/extensions/evil.ts": "import * as fs from \"node:fs\";\nfs.writeFileSync(" + string(q) + ", \"ran\");\nexport default function () {}\n",
	}
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	out, errs, code := runCLI(t, "prompt", "--agent", "omp", "--cwd", dir, "hello")
	if code != 0 || out != "ok: hello\n" {
		t.Fatalf("code %d out %q err %q", code, out, errs)
	}
	if ents, _ := os.ReadDir(marks); len(ents) > 0 {
		var ran []string
		for _, e := range ents {
			ran = append(ran, e.Name())
		}
		t.Fatalf("the cwd's own config ran: %v", ran)
	}
}
