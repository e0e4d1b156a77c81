package server

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/gitws"
	"github.com/agenthost/agenthost/internal/roomgit"
	"github.com/agenthost/agenthost/room"
)

// gitRepo makes a repository with two branches: main, whose README says
// "main", and feature, whose README says "feature". It returns its
// file:// URL and the branches' commits.
func gitRepo(t *testing.T) (url string, commits map[string]string) {
	t.Helper()
	dir := t.TempDir()
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
	git("init", "-q", "-b", "main")
	commits = map[string]string{}
	for _, br := range []string{"main", "feature"} {
		if br != "main" {
			git("checkout", "-q", "-b", br)
		}
		if err := os.WriteFile(filepath.Join(dir, "README"), []byte(br+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		git("add", "README")
		git("commit", "-q", "-m", br)
		commits[br] = git("rev-parse", "HEAD")
	}
	return "file://" + dir, commits
}

// newGitHarness is a harness whose rooms may take workspaces from git.
func newGitHarness(t *testing.T) *harness {
	t.Helper()
	eng, err := gitws.New(gitws.Options{Root: filepath.Join(t.TempDir(), "git")})
	if err != nil {
		t.Fatal(err)
	}
	return newHarness(t, room.Options{Sources: roomgit.New(eng), Snapshots: snapshots(t)}, Options{})
}

// Rooms on one repository get their own worktrees at their refs before
// their first turn (workspace.ready says what), separate from each other;
// what git cannot give is a 400 at PUT when it can tell, and a room keeps
// its repository and ref.
func TestGitWorkspaces(t *testing.T) {
	url, commits := gitRepo(t)
	h := newGitHarness(t)
	put := func(rm string, ws map[string]string) resp {
		return h.do("PUT", "/v1/rooms/"+rm+"/config", map[string]any{"workspace": ws})
	}
	for name, tc := range map[string]struct {
		ws   map[string]string
		want string
	}{
		"unreachable": {map[string]string{"git": "file:///nonexistent/repo", "ref": "main"}, "git: "},
		"unknown ref": {map[string]string{"git": url, "ref": "nope"}, `no branch or tag "nope"`},
		"no ref":      {map[string]string{"git": url}, "workspace needs git"},
		"a password":  {map[string]string{"git": "https://u:secret@example.invalid/r.git", "ref": "main"}, "git: "},
		"ext helper":  {map[string]string{"git": "ext::sh -c touch% /tmp/pwned", "ref": "main"}, "git: "},
	} {
		r := put("bad", tc.ws)
		msg, _ := r.json(t)["error"].(string)
		if r.status != http.StatusBadRequest || !strings.Contains(msg, tc.want) || strings.Contains(msg, "secret") {
			t.Errorf("%s: %d %s, want 400 naming %q", name, r.status, r.body, tc.want)
		}
	}
	for rm, ref := range map[string]string{"a": "main", "b": "feature"} {
		if r := put(rm, map[string]string{"git": url, "ref": ref}); r.status != http.StatusOK {
			t.Fatalf("PUT %s: %d %s", rm, r.status, r.body)
		}
		acc := h.post(rm, "read:README")
		d := h.ended(rm, acc)
		if d["outcome"] != "settled" || d["text"] != ref+"\n" {
			t.Fatalf("room %s: %v", rm, d)
		}
		// The checkout is not the turn's change.
		if c, _ := d["changes"].(map[string]any); c["files"] != 0.0 {
			t.Fatalf("room %s: the checkout counted as the turn's changes: %v", rm, d)
		}
		ready := h.until(rm, 0, func(ev sse) bool { return ev.typ == "workspace.ready" })
		if ready.data["commit"] != commits[ref] || ready.data["ref"] != ref || ready.data["kind"] != "branch" || ready.data["url"] != url {
			t.Fatalf("room %s: workspace.ready %v", rm, ready.data)
		}
	}
	// Separate worktrees: a file written in a is not in b.
	if d := h.ended("a", h.post("a", "write:mine.txt")); d["outcome"] != "settled" {
		t.Fatalf("write: %v", d)
	}
	if d := h.ended("b", h.post("b", "read:mine.txt")); d["outcome"] != "failed" {
		t.Fatalf("room b read room a's file: %v", d)
	}
	// A room keeps its repository and ref.
	if r := put("a", map[string]string{"git": url, "ref": "feature"}); r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "purge") {
		t.Fatalf("changing a room's ref: %d %s", r.status, r.body)
	}
	if r := put("a", map[string]string{"git": url, "ref": "main"}); r.status != http.StatusOK {
		t.Fatalf("the same workspace again: %d %s", r.status, r.body)
	}
	// Deleted for good, the room takes another ref as a new room.
	r := h.do("DELETE", "/v1/rooms/a?purge=true", nil)
	if d := r.json(t); r.status != http.StatusOK || d["purged"] != true || d["released"] != true || d["receipt"] == nil {
		t.Fatalf("purge: %d %s", r.status, r.body)
	}
	if r := h.do("GET", "/v1/rooms/a", nil); r.status != http.StatusNotFound {
		t.Fatalf("a purged room: %d %s", r.status, r.body)
	}
	if r := put("a", map[string]string{"git": url, "ref": "feature"}); r.status != http.StatusOK {
		t.Fatalf("the purged room's id with another ref: %d %s", r.status, r.body)
	}
	acc := h.post("a", "read:mine.txt")
	if acc.Seq != 1 {
		t.Fatalf("the new room's first event is %d", acc.Seq)
	}
	if d := h.ended("a", acc); d["outcome"] != "failed" {
		t.Fatalf("the new room has the old room's file: %v", d)
	}
	if d := h.ended("a", h.post("a", "read:README")); d["text"] != "feature\n" {
		t.Fatalf("the new room's workspace: %v", d)
	}
	// A room that already has files takes no checkout: its turn fails,
	// naming git, and the room goes on.
	if d := h.ended("c", h.post("c", "write:old.txt")); d["outcome"] != "settled" {
		t.Fatalf("room c: %v", d)
	}
	if r := put("c", map[string]string{"git": url, "ref": "main"}); r.status != http.StatusOK {
		t.Fatalf("PUT c: %d %s", r.status, r.body)
	}
	if d := h.ended("c", h.post("c", "read:README")); d["outcome"] != "failed" || !strings.HasPrefix(d["reason"].(string), "workspace: git: the room's workspace already holds files") {
		t.Fatalf("room c with files: %v", d)
	}
}
