package agents_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/agents"
)

// fakeNPM is an npm that "installs" a project by writing each pinned
// dependency's package.json (and a bun that prints its version), logging
// each run; FAKE_NPM_MODE=fail fails as npm does, =hang never ends.
const fakeNPM = `#!/bin/sh
echo "npm $* in $PWD" >> "$FAKE_NPM_LOG"
case "$FAKE_NPM_MODE" in
fail) echo "npm error code E404" >&2; echo "npm error 404 Not Found - GET @github/copilot" >&2; exit 1 ;;
hang) exec sleep 1000 ;;
esac
node -e '
const fs = require("fs"), path = require("path");
const deps = require(path.resolve("package.json")).dependencies;
for (const [n, v] of Object.entries(deps)) {
  const d = path.join("node_modules", n);
  fs.mkdirSync(d, {recursive: true});
  fs.writeFileSync(path.join(d, "package.json"), JSON.stringify({name: n, version: v}));
}
if (deps.bun) {
  fs.mkdirSync("node_modules/.bin", {recursive: true});
  fs.writeFileSync("node_modules/.bin/bun", "#!/bin/sh\necho " + deps.bun + "\n", {mode: 0o755});
}'
echo "added $(node -p 'Object.keys(require("./package.json").dependencies).length') packages in 0s"
`

// withFakeNPM puts fakeNPM first on PATH and returns its log.
func withFakeNPM(t *testing.T, mode string) (log string) {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		t.Fatalf("node is needed (make setup's requirement): %v", err)
	}
	bin := t.TempDir()
	if err := os.WriteFile(filepath.Join(bin, "npm"), []byte(fakeNPM), 0o755); err != nil {
		t.Fatal(err)
	}
	log = filepath.Join(t.TempDir(), "npm.log")
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_NPM_LOG", log)
	t.Setenv("FAKE_NPM_MODE", mode)
	return log
}

func npmRuns(t *testing.T, log string) []string {
	t.Helper()
	b, err := os.ReadFile(log)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// acpTools is a tools folder whose acp project pins the repository's
// versions and has nothing installed.
func acpTools(t *testing.T) *agents.Install {
	t.Helper()
	dir := t.TempDir()
	pj, err := os.ReadFile(filepath.Join("..", "..", ".tools", "acp", "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "acp"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "acp", "package.json"), pj, 0o644); err != nil {
		t.Fatal(err)
	}
	return &agents.Install{Dir: dir}
}

// syncWriter collects progress written from several goroutines.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
	// line, if set, is told of each write.
	line chan string
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Write(p)
	if w.line != nil {
		select {
		case w.line <- string(p):
		default:
		}
	}
	return len(p), nil
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// The ACP agents install on first need, once however many callers need
// them at the same time, saying so; after that nothing runs.
func TestEnsureACP_InstallsOnceWithProgress(t *testing.T) {
	log := withFakeNPM(t, "")
	in := acpTools(t)
	for _, k := range []agents.Kind{agents.Claude, agents.Codex, agents.Copilot} {
		if _, err := in.Version(k); !errors.Is(err, agents.ErrNotFound) || !strings.Contains(err.Error(), "make setup-acp") {
			t.Fatalf("%s before the install: %v", k, err)
		}
	}
	var progress syncWriter
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			errs[i] = in.EnsureACP(ctx, &progress)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatalf("EnsureACP: %v\n%s", err, progress.String())
		}
	}
	if runs := npmRuns(t, log); len(runs) != 1 || !strings.HasSuffix(runs[0], " in "+in.ACPDir()) || !strings.HasPrefix(runs[0], "npm install ") {
		t.Fatalf("npm runs: %q", runs)
	}
	out := progress.String()
	for _, want := range []string{
		"agenthost: installing the ACP agents (@agentclientprotocol/claude-agent-acp@0.101.0, @agentclientprotocol/codex-acp@2.6.0, @github/copilot@1.0.102) from the npm registry into " + in.ACPDir(),
		"added 3 packages",
		"agenthost: the ACP agents are installed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("progress lacks %q:\n%s", want, out)
		}
	}
	if v, err := in.Version(agents.Codex); err != nil || v != "2.6.0" {
		t.Fatalf("codex after the install: %q %v", v, err)
	}
	if err := in.EnsureACP(t.Context(), &progress); err != nil || len(npmRuns(t, log)) != 1 {
		t.Fatalf("second EnsureACP: %v, npm runs %q", err, npmRuns(t, log))
	}
}

// A tools folder from before the split keeps its ACP agents in its own
// node_modules: they are used, and nothing installs.
func TestEnsureACP_OldLayoutUsesWhatIsThere(t *testing.T) {
	log := withFakeNPM(t, "")
	dir := t.TempDir()
	for _, pkg := range []string{"@agentclientprotocol/claude-agent-acp", "@agentclientprotocol/codex-acp", "@github/copilot"} {
		p := filepath.Join(dir, "node_modules", pkg)
		if err := os.MkdirAll(p, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(p, "package.json"), []byte(`{"version":"0.0.1"}`), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	in := &agents.Install{Dir: dir}
	if err := in.EnsureACP(t.Context(), os.Stderr); err != nil {
		t.Fatal(err)
	}
	if v, err := in.Version(agents.Claude); err != nil || v != "0.0.1" {
		t.Fatalf("claude: %q %v", v, err)
	}
	if runs := npmRuns(t, log); len(runs) != 0 {
		t.Fatalf("npm ran: %q", runs)
	}
}

// npm's failure is an error that says what failed, in one line.
func TestEnsureACP_NPMFails(t *testing.T) {
	withFakeNPM(t, "fail")
	in := acpTools(t)
	var progress syncWriter
	err := in.EnsureACP(t.Context(), &progress)
	if !errors.Is(err, agents.ErrInstall) || !strings.Contains(err.Error(), "404 Not Found") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("EnsureACP with a failing npm: %v", err)
	}
}

// The caller's context bounds the install: npm is ended with it.
func TestEnsureACP_Cancelled(t *testing.T) {
	log := withFakeNPM(t, "hang")
	in := acpTools(t)
	progress := &syncWriter{line: make(chan string, 16)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- in.EnsureACP(ctx, progress) }()
	for line := range progress.line {
		if strings.Contains(line, "installing the ACP agents") {
			break
		}
	}
	// npm logs its run before it hangs: wait for that, then cancel.
	for deadline := time.Now().Add(30 * time.Second); len(npmRuns(t, log)) == 0; {
		if time.Now().After(deadline) {
			t.Fatal("npm never ran")
		}
		select {
		case err := <-done:
			t.Fatalf("EnsureACP ended before its cancel: %v", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, agents.ErrInstall) || !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled EnsureACP: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("EnsureACP outlived its context")
	}
}

// make run installs only what serve uses by default: the tools folder's
// own project pins omp, pi and Bun, and the ACP agents are a project of
// their own (installed on demand).
func TestToolsProjects(t *testing.T) {
	deps := func(path string) ([]string, map[string]json.RawMessage) {
		t.Helper()
		var pj struct {
			Dependencies map[string]string `json:"dependencies"`
		}
		var lock struct {
			Packages map[string]json.RawMessage `json:"packages"`
		}
		for file, v := range map[string]any{"package.json": &pj, "package-lock.json": &lock} {
			b, err := os.ReadFile(filepath.Join(path, file))
			if err != nil {
				t.Fatal(err)
			}
			if err := json.Unmarshal(b, v); err != nil {
				t.Fatalf("%s/%s: %v", path, file, err)
			}
		}
		var names []string
		for n := range pj.Dependencies {
			names = append(names, n)
		}
		slices.Sort(names)
		return names, lock.Packages
	}
	tools := filepath.Join("..", "..", ".tools")
	core, coreLock := deps(tools)
	if want := []string{"@mariozechner/pi-coding-agent", "@oh-my-pi/pi-coding-agent", "bun"}; !slices.Equal(core, want) {
		t.Errorf(".tools/package.json pins %q, want only %q (what serve uses by default)", core, want)
	}
	acp, acpLock := deps(filepath.Join(tools, "acp"))
	if want := []string{"@agentclientprotocol/claude-agent-acp", "@agentclientprotocol/codex-acp", "@github/copilot"}; !slices.Equal(acp, want) {
		t.Errorf(".tools/acp/package.json pins %q, want %q", acp, want)
	}
	for _, name := range acp {
		if _, ok := coreLock["node_modules/"+name]; ok {
			t.Errorf(".tools/package-lock.json installs %s", name)
		}
		if _, ok := acpLock["node_modules/"+name]; !ok {
			t.Errorf(".tools/acp/package-lock.json does not lock %s", name)
		}
	}
}
