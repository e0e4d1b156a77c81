package gitws_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agenthost/agenthost/internal/gitws"
)

// TestEngine_FileRootsBindMount: a bind mount of the data dir, or of a folder inside it, into
// an allowed root does not open it. It runs in a mount namespace of its own (unshare -m), so
// the mounts are seen by nobody else and vanish with it.
func TestEngine_FileRootsBindMount(t *testing.T) {
	if os.Getenv("GITWS_BIND_HELPER") == "" {
		unshare, err := exec.LookPath("unshare")
		if err != nil {
			t.Skip("needs unshare(1) for a mount namespace")
		}
		cmd := exec.Command(unshare, "--mount", "--propagation", "private", os.Args[0],
			"-test.run=^TestEngine_FileRootsBindMount$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "GITWS_BIND_HELPER=1")
		out, err := cmd.CombinedOutput()
		if err != nil && strings.Contains(string(out), "unshare failed") {
			t.Skipf("no mount namespace here (needs CAP_SYS_ADMIN): %s", strings.TrimSpace(string(out)))
		}
		if err != nil || !strings.Contains(string(out), "--- PASS: TestEngine_FileRootsBindMount") {
			t.Fatalf("in a mount namespace: %v\n%s", err, out)
		}
		return
	}
	l := newServerLayout(t)
	e := l.engine(t)
	whole, part := filepath.Join(l.allowed, "whole"), filepath.Join(l.allowed, "part")
	for _, m := range [][2]string{{l.data, whole}, {filepath.Dir(l.snapshots), part}} {
		if err := os.MkdirAll(m[1], 0o700); err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mount(m[0], m[1], "", syscall.MS_BIND, ""); err != nil {
			t.Fatalf("mount --bind %s %s: %v", m[0], m[1], err)
		}
		t.Cleanup(func() { _ = syscall.Unmount(m[1], 0) })
	}
	root := filepath.Join(l.data, "git")
	const own = "inside the server's own folders"
	refused(t, e, root, "file://"+filepath.Join(whole, "rooms", "victim", "snapshots", "repo"), "snapshots", own)
	refused(t, e, root, "file://"+filepath.Join(part, "repo"), "snapshots", own)
	if err := e.Validate(tctx(t), gitws.Spec{Git: l.good.url, Ref: "main"}); err != nil {
		t.Errorf("the good repository: %v", err)
	}
}
