package room_test

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/client"
	"github.com/agenthost/agenthost/internal/confine"
)

// outsideModule writes a module of its own (files by name, with a go.mod
// naming it example.com/outside) joined to this one by a go.work, as a
// program that requires agenthost would be; it returns the module's
// folder and the environment to build and run it with. The program finds
// the agents where a user's would: in the tools folder AGENTHOST_TOOLS
// names (here this checkout's, which `make setup` filled).
func outsideModule(t *testing.T, files map[string][]byte) (string, []string) {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	files["go.mod"] = []byte("module example.com/outside\n\ngo 1.26.0\n")
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(outside, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	work := filepath.Join(dir, "go.work")
	if err := os.WriteFile(work, []byte("go 1.26.0\n\nuse (\n\t"+root+"\n\t./outside\n)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tools := os.Getenv("AGENTHOST_TOOLS")
	if tools == "" {
		tools = filepath.Join(root, ".tools")
	}
	return outside, append(os.Environ(), "GOWORK="+work, "GOFLAGS=", "AGENTHOST_TOOLS="+tools)
}

// goBuild builds the module in dir into dir/prog.
func goBuild(ctx context.Context, t *testing.T, dir string, env []string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	cmd := exec.CommandContext(ctx, goBin, "build", "-o", "prog", ".")
	cmd.Dir, cmd.Env = dir, env
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the outside program: %v\n%s", err, out)
	}
	return filepath.Join(dir, "prog")
}

// TestOutsideModule_HostsARoomOnPiWithThePublicLibrary builds a program
// in a module of its own (testdata/outside) that hosts a room on real pi
// with the public packages only (sqlitestore, transport, modeltest,
// httpapi, client): a turn, an approval and a question pi asks through
// agenthost's extension, a message through the HTTP API mounted on the program's own
// mux, and the store reopened; as root, it runs again as uid 65534.
// Naming an internal package there would not compile ("use of internal
// package").
func TestOutsideModule_HostsARoomOnPiWithThePublicLibrary(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "outside", "main.go"))
	if err != nil {
		t.Fatal(err)
	}
	dir, env := outsideModule(t, map[string][]byte{"main.go": src})
	// Building the program (SQLite, the MCP SDK, Landlock) takes minutes
	// on a busy machine, before pi runs.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	prog := goBuild(ctx, t, dir, env)
	confined := "none"
	if confine.KernelABI() > 0 {
		confined = "landlock"
	}
	want := "ok: hello\nended: settled\nconfined: " + confined + "\nasks: bash\ntool: \"hi\\n\"\napproved: settled done\n" +
		"question: Which color? [red blue]\nthe agent got blue: true\nanswered: settled done\napi: settled\n" +
		"wrong token refused: true\nstored: ann ended settled\nstored: ann ended settled\nstored: ann ended settled\nstored: bob ended settled\nreleased: true <nil>\n"
	cmd := exec.CommandContext(ctx, prog)
	cmd.Dir, cmd.Env = dir, env
	if out, err := cmd.CombinedOutput(); err != nil || string(out) != want {
		t.Fatalf("the outside program: %v; printed:\n%s\nwant:\n%s", err, out, want)
	}
	if os.Geteuid() != 0 {
		return // the run above was the non-root one
	}
	// Most programs run as a user of their own: the same program as
	// uid 65534, its store and rooms in a folder of that user's.
	shared, err := os.MkdirTemp("", "outside-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(shared)
	tmp := filepath.Join(shared, "tmp")
	b, err := os.ReadFile(prog)
	if err == nil {
		err = errors.Join(os.Chmod(shared, 0o755), os.WriteFile(filepath.Join(shared, "prog"), b, 0o755), os.Mkdir(tmp, 0o700), os.Chown(tmp, 65534, 65534))
	}
	if err != nil {
		t.Fatal(err)
	}
	cmd = exec.CommandContext(ctx, "setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", filepath.Join(shared, "prog"))
	cmd.Dir, cmd.Env = tmp, append(env, "TMPDIR="+tmp, "HOME="+tmp)
	if out, err := cmd.CombinedOutput(); err != nil || string(out) != want {
		t.Fatalf("the outside program as uid 65534: %v; printed:\n%s\nwant:\n%s", err, out, want)
	}
}

// TestReadmeLibraryProgram builds the program of the README's "Hosting
// rooms in a Go program" as a module of its own, runs it (on a free port
// instead of 7420), sends it a message with package client as a user
// would, and stops it with SIGTERM: it must answer on omp and exit 0.
func TestReadmeLibraryProgram(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, sec, ok := strings.Cut(string(b), "\n## Hosting rooms in a Go program\n")
	if !ok {
		t.Fatal(`README has no section "Hosting rooms in a Go program"`)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	_, src, ok := strings.Cut(sec, "```go\n")
	src, _, ok2 := strings.Cut(src, "```")
	if !ok || !ok2 || !strings.Contains(src, `"127.0.0.1:7420"`) {
		t.Fatal("the section has no Go program listening on 127.0.0.1:7420")
	}
	if n := strings.Count(src, "\n"); n > 80 {
		t.Errorf("the README's program is %d lines", n)
	}
	src = strings.Replace(src, `"127.0.0.1:7420"`, `"127.0.0.1:0"`, 1)
	dir, env := outsideModule(t, map[string][]byte{"main.go": []byte(src)})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	prog := goBuild(ctx, t, dir, env)

	const token = "readme-token"
	cmd := exec.CommandContext(ctx, prog)
	cmd.Dir, cmd.Env = dir, append(env, "AGENTHOST_TOKEN="+token)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill() }()
	lines := bufio.NewScanner(stderr)
	var url string
	var log []string
	for url == "" && lines.Scan() {
		log = append(log, lines.Text())
		if _, u, ok := strings.Cut(lines.Text(), "serving rooms at "); ok {
			url = strings.TrimSpace(u)
		}
	}
	if url == "" {
		t.Fatalf("the program never said where it serves:\n%s", strings.Join(log, "\n"))
	}
	rest := make(chan []string, 1)
	go func() {
		var more []string
		for lines.Scan() {
			more = append(more, lines.Text())
		}
		rest <- more
	}()

	c, err := client.New(url, client.Options{Token: token})
	if err != nil {
		t.Fatal(err)
	}
	acc, err := c.Send(ctx, "general", client.NewMessage{Text: "hello", Sender: "ann"})
	if err != nil {
		t.Fatal(err)
	}
	ended, err := c.Wait(ctx, "general", acc)
	if err != nil || ended.Outcome != "settled" {
		t.Fatalf("the message through the README's program: %+v, %v", ended, err)
	}
	if _, err := c.Room(ctx, "general"); err != nil {
		t.Fatal(err)
	}
	wrong, err := client.New(url, client.Options{Token: "wrong"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := wrong.Room(ctx, "general"); !errors.Is(err, client.ErrUnauthorized) {
		t.Errorf("a wrong token: %v, want ErrUnauthorized", err)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	more := <-rest
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the program after SIGTERM: %v\n%s", err, strings.Join(more, "\n"))
	}
	if len(more) > 0 {
		t.Errorf("the program logged at its end:\n%s", strings.Join(more, "\n"))
	}
}
