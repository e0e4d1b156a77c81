package room_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/confine"
)

// TestOutsideModule_HostsARoomOnPiWithThePublicLibrary builds a program
// in a module of its own (testdata/outside, joined to this one by a
// go.work as a program that requires agenthost would be) that hosts a
// room on real pi with the public packages only (sqlitestore, transport,
// modeltest, httpapi, client): a turn, an approval pi asks through
// agenthost's extension, a message through the HTTP API mounted on the
// program's own mux, and the store reopened. Naming an internal package
// there would not compile ("use of internal package").
func TestOutsideModule_HostsARoomOnPiWithThePublicLibrary(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	outside := filepath.Join(dir, "outside")
	if err := os.Mkdir(outside, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"go.mod", "main.go"} {
		b, err := os.ReadFile(filepath.Join("testdata", "outside", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(outside, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	work := filepath.Join(dir, "go.work")
	if err := os.WriteFile(work, []byte("go 1.26.0\n\nuse (\n\t"+root+"\n\t./outside\n)\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	// Building the program (SQLite, the MCP SDK, Landlock) takes minutes
	// on a busy machine, before pi runs.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "run", ".")
	cmd.Dir = outside
	// The program finds pi where a user's would: in the tools folder
	// AGENTHOST_TOOLS names (here this checkout's, which `make setup`
	// filled).
	tools := os.Getenv("AGENTHOST_TOOLS")
	if tools == "" {
		tools = filepath.Join(root, ".tools")
	}
	cmd.Env = append(os.Environ(), "GOWORK="+work, "GOFLAGS=", "AGENTHOST_TOOLS="+tools)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the outside program: %v\n%s", err, out)
	}
	confined := "none"
	if confine.KernelABI() > 0 {
		confined = "landlock"
	}
	want := "ok: hello\nended: settled\nconfined: " + confined + "\nasks: bash\ntool: \"hi\\n\"\napproved: settled done\napi: settled\n" +
		"wrong token refused: true\nstored: ann ended settled\nstored: ann ended settled\nstored: bob ended settled\nreleased: true <nil>\n"
	if string(out) != want {
		t.Fatalf("the outside program printed:\n%s\nwant:\n%s", out, want)
	}
}
