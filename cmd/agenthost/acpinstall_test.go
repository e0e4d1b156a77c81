package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/agents"
)

// The ACP agents are installed when a command first needs one: `prompt
// --transport acp --agent copilot` on a tools folder without them runs
// npm in its acp project (a fake npm here, which links the real packages
// in), says so on stderr, and the real copilot answers.
func TestPromptACP_InstallsOnFirstNeed(t *testing.T) {
	real, err := agents.Find()
	if err != nil {
		t.Fatalf("the real agents are needed (make setup-test): %v", err)
	}
	if _, err := real.Version(agents.Copilot); err != nil {
		t.Fatalf("copilot is needed (make setup-test): %v", err)
	}
	// Where the real ACP packages are: the acp project, or (a tools folder
	// from before the split) the folder's own node_modules.
	realACP := filepath.Join(real.ACPDir(), "node_modules")
	if _, err := os.Stat(filepath.Join(realACP, "@github", "copilot")); err != nil {
		realACP = filepath.Join(real.Dir, "node_modules")
	}

	tools := t.TempDir()
	pj, err := os.ReadFile(filepath.Join("..", "..", ".tools", "acp", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"node_modules", "acp"} {
		if err := os.MkdirAll(filepath.Join(tools, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(tools, "acp", "package.json"), pj, 0o644); err != nil {
		t.Fatal(err)
	}
	// copilot unpacks itself into the cache on its first start: share the real one.
	if err := os.Symlink(real.CacheDir(), filepath.Join(tools, "cache")); err != nil {
		t.Fatal(err)
	}
	bin := t.TempDir()
	log := filepath.Join(t.TempDir(), "npm.log")
	npm := "#!/bin/sh\necho \"npm $* in $PWD\" >> " + log + "\nln -s " + realACP + " node_modules\necho 'added 151 packages in 1s'\n"
	if err := os.WriteFile(filepath.Join(bin, "npm"), []byte(npm), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv(agents.ToolsEnv, tools)

	// Unconfined: the packages linked in live outside this tools folder,
	// where a confined agent may not read (confinement has its own tests).
	out, errs, code := runCLI(t, "prompt", "--confine", "off", "--transport", "acp", "--agent", "copilot", "[[say:installed on first need]]")
	if code != 0 || out != "installed on first need\n" {
		t.Fatalf("exit %d, stdout %q, stderr:\n%s", code, out, errs)
	}
	for _, want := range []string{"agenthost: installing the ACP agents (", "added 151 packages", "agenthost: the ACP agents are installed ("} {
		if !strings.Contains(errs, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errs)
		}
	}
	runs, err := os.ReadFile(log)
	if err != nil || strings.Count(string(runs), "\n") != 1 || !strings.Contains(string(runs), " in "+filepath.Join(tools, "acp")) {
		t.Fatalf("npm runs %q %v", runs, err)
	}
}
