package server

import (
	"io/fs"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/roomsnap"
	"github.com/agenthost/agenthost/room"
)

// snapshots are the rooms' real snapshots (the engine over git), closed
// after the harness's manager.
func snapshots(t *testing.T) *roomsnap.Snapshots {
	s := roomsnap.New(roomsnap.Options{})
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func TestTurnDiffAndRevert(t *testing.T) {
	diffAndRevert(t, newHarness(t, room.Options{Snapshots: snapshots(t)}, Options{}))
}

// diffAndRevert: a turn that writes a file counts it in turn.ended, its
// diff names it, a revert takes it back (409 while a turn runs), and the
// next prompt is told.
func diffAndRevert(t *testing.T, h *harness) {
	acc := h.post("snap", "write:new.txt")
	d := h.ended("snap", acc)
	turn, _ := d["turn_id"].(string)
	c, _ := d["changes"].(map[string]any)
	if c["files"] != 1.0 || c["insertions"] != 1.0 || c["deletions"] != 0.0 {
		t.Fatalf("turn.ended %v", d)
	}
	r := h.do("GET", "/v1/rooms/snap/turns/"+turn+"/diff", nil)
	diff := r.json(t)
	files, _ := diff["files"].([]any)
	if r.status != http.StatusOK || len(files) != 1 || diff["truncated"] != false ||
		!strings.Contains(diff["patch"].(string), "+hello") {
		t.Fatalf("diff: %d %s", r.status, r.body)
	}
	if f := files[0].(map[string]any); f["path"] != "new.txt" || f["status"] != "added" || f["insertions"] != 1.0 {
		t.Fatalf("diff file %v", f)
	}

	hang := h.post("snap", "hang")
	started := h.until("snap", hang.Seq, func(ev sse) bool { return ev.typ == "turn.started" })
	if r := h.do("POST", "/v1/rooms/snap/turns/"+turn+"/revert", nil); r.status != http.StatusConflict {
		t.Fatalf("revert while a turn runs: %d %s", r.status, r.body)
	}
	running, _ := started.data["turn_id"].(string)
	if r := h.do("GET", "/v1/rooms/snap/turns/"+running+"/diff", nil); r.status != http.StatusConflict {
		t.Fatalf("diff of the running turn: %d %s", r.status, r.body)
	}
	if r := h.do("POST", "/v1/rooms/snap/cancel", nil); r.status != http.StatusAccepted {
		t.Fatalf("cancel: %d", r.status)
	}
	h.ended("snap", hang)

	r = h.do("POST", "/v1/rooms/snap/turns/"+turn+"/revert", nil)
	if out := r.json(t); r.status != http.StatusOK || out["reverted"] != true || out["turn_id"] != turn ||
		len(out["files"].([]any)) != 1 || out["files"].([]any)[0] != "new.txt" {
		t.Fatalf("revert: %d %s", r.status, r.body)
	}
	ws := h.f.lastSpec().Workspace
	if _, err := os.Stat(filepath.Join(ws, "new.txt")); !os.IsNotExist(err) {
		t.Fatalf("new.txt after the revert: %v", err)
	}
	ev := h.until("snap", hang.Seq, func(ev sse) bool { return ev.typ == "workspace.reverted" })
	if ev.data["turn_id"] != turn || ev.data["count"] != 1.0 {
		t.Fatalf("workspace.reverted %v", ev.data)
	}
	next := h.post("snap", "next")
	h.ended("snap", next)
	if p := h.f.lastPrompt(); !strings.HasPrefix(p, "[The workspace was reverted to its state before turn "+turn) ||
		strings.Count(p, "\n") != 1 {
		t.Fatalf("next prompt %q", p)
	}
}

// A workspace that is itself a git repository (a branch, a commit, a
// staged file, an unstaged edit, an untracked file): a turn's snapshots
// and its revert, and a revert to before the repository existed, leave its
// .git byte for byte as it was, and its status too where the files are
// back.
func TestTurnSnapshotsLeaveTheWorkspaceRepositoryAlone(t *testing.T) {
	h := newHarness(t, room.Options{Snapshots: snapshots(t)}, Options{})
	first := h.ended("repo", h.post("repo", "hi"))["turn_id"].(string)
	ws := h.f.lastSpec().Workspace
	git := func(args ...string) string {
		t.Helper()
		cmd := exec.Command("git", append([]string{"--no-optional-locks"}, args...)...)
		cmd.Dir = ws
		cmd.Env = append(os.Environ(), "GIT_CONFIG_GLOBAL="+os.DevNull, "GIT_CONFIG_NOSYSTEM=1",
			"GIT_AUTHOR_NAME=u", "GIT_AUTHOR_EMAIL=u@example.com", "GIT_COMMITTER_NAME=u", "GIT_COMMITTER_EMAIL=u@example.com")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	write := func(name, text string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(ws, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	git("init", "-q", "-b", "main")
	write("tracked.txt", "v1\n")
	git("add", "tracked.txt")
	git("commit", "-q", "-m", "first")
	git("branch", "feature")
	write("tracked.txt", "v2\n")
	write("staged.txt", "staged\n")
	git("add", "staged.txt")
	write("untracked.txt", "mine\n")
	// Its .git, every file's mode and bytes, and what git says of it.
	dotGit := func() map[string]string {
		t.Helper()
		m := map[string]string{}
		err := filepath.WalkDir(filepath.Join(ws, ".git"), func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			m[p] = fi.Mode().String()
			if d.Type().IsRegular() {
				b, err := os.ReadFile(p)
				m[p] += " " + string(b)
				return err
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	status := func() string {
		return git("status", "--porcelain=v2", "--branch") + git("branch", "--list") + git("rev-parse", "HEAD")
	}
	wantGit, wantStatus := dotGit(), status()
	if !strings.Contains(wantStatus, "# branch.head main") || !strings.Contains(wantStatus, "feature") ||
		!strings.Contains(wantStatus, "staged.txt") || !strings.Contains(wantStatus, "? untracked.txt") {
		t.Fatalf("the repository's status %q", wantStatus)
	}

	d := h.ended("repo", h.post("repo", "write:new.txt"))
	turn, _ := d["turn_id"].(string)
	if c, _ := d["changes"].(map[string]any); c["files"] != 1.0 {
		t.Fatalf("turn.ended %v", d)
	}
	r := h.do("GET", "/v1/rooms/repo/turns/"+turn+"/diff", nil)
	if files, _ := r.json(t)["files"].([]any); r.status != http.StatusOK || len(files) != 1 || files[0].(map[string]any)["path"] != "new.txt" {
		t.Fatalf("diff: %d %s", r.status, r.body)
	}
	if got := dotGit(); !maps.Equal(got, wantGit) {
		t.Fatalf("the workspace's .git changed across a turn's snapshots")
	}
	r = h.do("POST", "/v1/rooms/repo/turns/"+turn+"/revert", nil)
	if files, _ := r.json(t)["files"].([]any); r.status != http.StatusOK || len(files) != 1 || files[0] != "new.txt" {
		t.Fatalf("revert: %d %s", r.status, r.body)
	}
	if got := dotGit(); !maps.Equal(got, wantGit) {
		t.Fatalf("the workspace's .git changed across a revert")
	}
	if got := status(); got != wantStatus {
		t.Fatalf("status after the revert %q, want %q", got, wantStatus)
	}

	// Back to before the repository was made: its files go, its .git stays.
	r = h.do("POST", "/v1/rooms/repo/turns/"+first+"/revert", nil)
	if files, _ := r.json(t)["files"].([]any); r.status != http.StatusOK || len(files) != 3 {
		t.Fatalf("revert of the first turn: %d %s", r.status, r.body)
	}
	if _, err := os.Stat(filepath.Join(ws, "tracked.txt")); !os.IsNotExist(err) {
		t.Fatalf("tracked.txt after the revert of the first turn: %v", err)
	}
	if got := dotGit(); !maps.Equal(got, wantGit) {
		t.Fatalf("the workspace's .git changed across a revert to before it was made")
	}
}
