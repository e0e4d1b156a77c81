package room_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// TestOutsideModule_HostsARoomOnItsOwnStoreAndTransport builds a program
// in a module of its own (testdata/outside, joined to this one by a
// go.work as a program that requires agenthost would be) that implements
// room.Store and room.Transport with only the public packages, and runs a
// room on them. Naming an internal type there would not compile ("use of
// internal package").
func TestOutsideModule_HostsARoomOnItsOwnStoreAndTransport(t *testing.T) {
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goBin, "run", ".")
	cmd.Dir = outside
	cmd.Env = append(os.Environ(), "GOWORK="+work, "GOFLAGS=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the outside program: %v\n%s", err, out)
	}
	if want := "ok: hello\nended: settled\nevents: true <nil>\n"; string(out) != want {
		t.Fatalf("the outside program printed:\n%s\nwant:\n%s", out, want)
	}
}
