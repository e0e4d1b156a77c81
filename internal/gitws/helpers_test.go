package gitws_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/agenthost/agenthost/internal/gitws"
)

// TestMain fails the run if a test leaves a goroutine behind (the engine starts none of its own;
// exec's copying goroutines must be joined).
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testTimeout bounds each test's git work; local repositories take well under a second, so this
// only catches a hang on a loaded machine.
const testTimeout = 60 * time.Second

func tctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	return ctx
}

// fixtureEnv runs the tests' own git (which builds fixtures) without the host's configuration.
var fixtureEnv = []string{
	"GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=" + os.DevNull, "GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com",
	"GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com", "GIT_TERMINAL_PROMPT=0",
}

// git runs git in dir for a fixture and returns its trimmed stdout.
func git(t testing.TB, dir string, args ...string) string {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), fixtureEnv...)
	out, err := cmd.Output()
	if err != nil {
		stderr := ""
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("git %s: %v: %s", strings.Join(args, " "), err, stderr)
	}
	return strings.TrimSpace(string(out))
}

func writeFile(t testing.TB, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// repo is a local fixture repository: branch main (two commits; tag v1 on the first), branch
// dev (from the first, with dev.txt).
type repo struct {
	dir, url      string
	first, second string // main's commits
	dev           string // dev's commit
}

func newRepo(t testing.TB) *repo {
	t.Helper()
	dir := t.TempDir()
	git(t, dir, "init", "--quiet", "--initial-branch=main")
	writeFile(t, filepath.Join(dir, "README"), "first\n")
	git(t, dir, "add", ".")
	git(t, dir, "commit", "--quiet", "-m", "first")
	first := git(t, dir, "rev-parse", "HEAD")
	git(t, dir, "tag", "-a", "-m", "version 1", "v1")
	git(t, dir, "checkout", "--quiet", "-b", "dev")
	writeFile(t, filepath.Join(dir, "dev.txt"), "on dev\n")
	git(t, dir, "add", ".")
	git(t, dir, "commit", "--quiet", "-m", "dev")
	dev := git(t, dir, "rev-parse", "HEAD")
	git(t, dir, "checkout", "--quiet", "main")
	writeFile(t, filepath.Join(dir, "README"), "second\n")
	git(t, dir, "commit", "--quiet", "-am", "second")
	second := git(t, dir, "rev-parse", "HEAD")
	return &repo{dir: dir, url: "file://" + dir, first: first, second: second, dev: dev}
}

// newEngine returns an engine on a fresh root that takes file:// repositories under the
// temporary folder (where the fixtures are) unless opts says otherwise.
func newEngine(t testing.TB, opts gitws.Options) *gitws.Engine {
	t.Helper()
	if opts.Root == "" {
		opts.Root = t.TempDir()
	}
	if opts.FileRoots == nil {
		opts.FileRoots = []string{os.TempDir()}
	}
	e, err := gitws.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func readFile(t testing.TB, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func exists(path string) bool {
	_, err := os.Lstat(path)
	return err == nil
}

// entries lists a folder's names ("" when it does not exist).
func entries(t testing.TB, dir string) string {
	t.Helper()
	es, err := os.ReadDir(dir)
	if err != nil {
		if os.IsNotExist(err) {
			return ""
		}
		t.Fatal(err)
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return fmt.Sprint(names)
}

func execLookGit() (string, error) { return exec.LookPath("git") }
