//go:build unix

package server

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/agenthost/agenthost/internal/gitws"
	"github.com/agenthost/agenthost/internal/roomgit"
	"github.com/agenthost/agenthost/room"
)

// hungGitRepo adds to a gitRepo a branch "hang" that no fetch can bring:
// its new blob is a FIFO in place of a loose object, so upload-pack blocks
// opening it. It returns a git wrapper (for gitws.Options.Git) that writes
// a line into the FIFO it returns before each fetch of that branch
// (blocking until it is read), so a test knows that fetch began.
func hungGitRepo(t *testing.T, url string) (gitPath, signal string) {
	t.Helper()
	dir := strings.TrimPrefix(url, "file://")
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false"}, args...)...)
		cmd.Dir = dir
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return strings.TrimSpace(string(out))
	}
	git("checkout", "-q", "-b", "hang", "main")
	if err := os.WriteFile(filepath.Join(dir, "hang.txt"), []byte("never sent\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	git("add", "hang.txt")
	git("commit", "-q", "-m", "hang")
	blob := git("rev-parse", "HEAD:hang.txt")
	git("checkout", "-q", "main")
	obj := filepath.Join(dir, ".git", "objects", blob[:2], blob[2:])
	if err := os.Remove(obj); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(obj, 0o600); err != nil {
		t.Fatal(err)
	}
	real, err := exec.LookPath("git")
	if err != nil {
		t.Fatal(err)
	}
	wd := t.TempDir()
	signal, gitPath = filepath.Join(wd, "signal"), filepath.Join(wd, "git")
	if err := syscall.Mkfifo(signal, 0o600); err != nil {
		t.Fatal(err)
	}
	script := "#!/bin/sh\ncase \" $* \" in *\" fetch \"*refs/heads/hang*) echo started > \"" + signal + "\";; esac\nexec \"" + real + "\" \"$@\"\n"
	if err := os.WriteFile(gitPath, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return gitPath, signal
}

// While one room's checkout hangs in a fetch that never ends, another
// room's first checkout of a branch the mirror has settles, and a room on
// the same repository is purged at once; the hung room's turn ends when it
// is cancelled (or at its turn_timeout, as the failure says).
func TestGitWorkspaceHungFetch(t *testing.T) {
	url, commits := gitRepo(t)
	gitPath, signal := hungGitRepo(t, url)
	data := t.TempDir()
	eng, err := gitws.New(gitws.Options{Root: filepath.Join(data, "git"), Git: gitPath, FileRoots: []string{os.TempDir()}, Denied: []string{data}})
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, room.Options{Root: filepath.Join(data, "rooms"), Sources: roomgit.New(eng), Snapshots: snapshots(t)}, Options{})
	put := func(rm, ref, timeout string) {
		t.Helper()
		if r := h.do("PUT", "/v1/rooms/"+rm+"/config", map[string]any{"turn_timeout": timeout,
			"workspace": map[string]string{"git": url, "ref": ref}}); r.status != http.StatusOK {
			t.Fatalf("PUT %s: %d %s", rm, r.status, r.body)
		}
	}
	put("early", "main", "5m")
	if d := h.ended("early", h.post("early", "read:README")); d["outcome"] != "settled" {
		t.Fatalf("early: %v", d)
	}
	put("hang", "hang", "1h")
	put("late", "main", "5m")
	hang := h.post("hang", "read:hang.txt")
	sig, err := os.Open(signal) // until the hung fetch begins
	if err != nil {
		t.Fatal(err)
	}
	_, err = sig.Read(make([]byte, 8))
	sig.Close()
	if err != nil {
		t.Fatal(err)
	}
	if d := h.ended("late", h.post("late", "read:README")); d["outcome"] != "settled" || d["text"] != "main\n" {
		t.Fatalf("late, on main, while hang's fetch hangs: %v", d)
	}
	if ev := h.until("late", 0, func(ev sse) bool { return ev.typ == "workspace.ready" }); ev.data["commit"] != commits["main"] {
		t.Fatalf("late's workspace.ready %v", ev.data)
	}
	if r := h.do("DELETE", "/v1/rooms/early?purge=true", nil); r.status != http.StatusOK {
		t.Fatalf("purge of early while hang's fetch hangs: %d %s", r.status, r.body)
	}
	if r := h.do("POST", "/v1/rooms/hang/cancel", nil); r.status != http.StatusAccepted {
		t.Fatalf("cancel hang: %d %s", r.status, r.body)
	}
	if d := h.ended("hang", hang); d["outcome"] != "cancelled" {
		t.Fatalf("hang: %v", d)
	}
}
