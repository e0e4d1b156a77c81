package agents_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// setupCheckout copies what scripts/setup.sh reads (the script and the
// tools folder's projects) into a fresh folder, with fake go, apt-get and
// chromium (and fakeNPM) first on PATH; run runs the script there.
func setupCheckout(t *testing.T) (dir string, run func(args ...string) string, npmLog, aptLog string) {
	t.Helper()
	npmLog = withFakeNPM(t, "")
	dir = t.TempDir()
	for _, f := range []string{"scripts/setup.sh", ".tools/package.json", ".tools/package-lock.json",
		".tools/acp/package.json", ".tools/acp/package-lock.json", ".tools/lint/package.json", ".tools/lint/package-lock.json",
		"internal/tracing/testdata/jaeger/go.mod"} {
		b, err := os.ReadFile(filepath.Join("..", "..", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, f)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	bin := t.TempDir()
	aptLog = filepath.Join(t.TempDir(), "apt.log")
	fakes := map[string]string{
		"go":       "#!/bin/sh\nmkdir -p bin && touch bin/agenthost\n",
		"apt-get":  "#!/bin/sh\necho \"apt-get $*\" >> " + aptLog + "\n",
		"chromium": "#!/bin/sh\necho Chromium 1.0\n",
	}
	for name, script := range fakes {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	run = func(args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		out, err := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(dir, "scripts", "setup.sh")}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("setup.sh %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	return dir, run, npmLog, aptLog
}

// make run's setup installs what serve uses by default (omp, pi, Bun) and
// nothing else: no ACP agent, no Chromium. --acp adds the ACP agents,
// --test Redocly CLI, Jaeger's build and Chromium too (and builds no
// binary); a second run installs nothing.
func TestSetup_RunInstallsOnlyWhatServeUses(t *testing.T) {
	dir, run, npmLog, aptLog := setupCheckout(t)
	out := run()
	if runs := npmRuns(t, npmLog); len(runs) != 1 || !strings.HasSuffix(runs[0], " in "+filepath.Join(dir, ".tools")) {
		t.Fatalf("npm runs of make run's setup: %q\n%s", runs, out)
	}
	for _, pkg := range []string{"@oh-my-pi/pi-coding-agent", "@mariozechner/pi-coding-agent", "bun"} {
		if _, err := os.Stat(filepath.Join(dir, ".tools", "node_modules", pkg, "package.json")); err != nil {
			t.Errorf("%s is not installed: %v", pkg, err)
		}
	}
	for _, pkg := range []string{"@agentclientprotocol/claude-agent-acp", "@agentclientprotocol/codex-acp", "@github/copilot"} {
		for _, nm := range []string{".tools/node_modules", ".tools/acp/node_modules"} {
			if _, err := os.Stat(filepath.Join(dir, nm, pkg)); err == nil {
				t.Errorf("make run's setup installed %s into %s", pkg, nm)
			}
		}
	}
	if strings.Contains(strings.ToLower(out), "chromium") || len(npmRuns(t, aptLog)) != 0 {
		t.Errorf("make run's setup looked at Chromium:\n%s", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "bin", "agenthost")); err != nil {
		t.Errorf("no binary: %v", err)
	}

	out = run("--acp")
	runs := npmRuns(t, npmLog)
	if len(runs) != 2 || !strings.HasSuffix(runs[1], " in "+filepath.Join(dir, ".tools", "acp")) || !strings.Contains(out, "omp 18.2.3, pi 0.73.1, bun 1.3.14 already installed") {
		t.Fatalf("setup --acp: npm runs %q\n%s", runs, out)
	}
	// make test's setup builds no bin/agenthost: no test runs it, and the
	// tests build with the race flags.
	if err := os.Remove(filepath.Join(dir, "bin", "agenthost")); err != nil {
		t.Fatal(err)
	}
	out = run("--test")
	if runs := npmRuns(t, npmLog); len(runs) != 3 || !strings.HasSuffix(runs[2], " in "+filepath.Join(dir, ".tools", "lint")) ||
		!strings.Contains(out, "chromium for the browser test: Chromium 1.0") ||
		!strings.Contains(out, "building Jaeger into Go's build cache") ||
		!strings.Contains(out, "ACP agents: claude-agent-acp 0.101.0, codex-acp 2.6.0, copilot 1.0.102 already installed") {
		t.Fatalf("setup --test: npm runs %q\n%s", runs, out)
	}
	if _, err := os.Stat(filepath.Join(dir, "bin", "agenthost")); !os.IsNotExist(err) {
		t.Errorf("setup --test built bin/agenthost (%v):\n%s", err, out)
	}
}
