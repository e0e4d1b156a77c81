package server

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
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

// newGitHarness is a harness whose rooms may take workspaces from git, laid
// out as serve does: the rooms (homes, workspaces, snapshots) and the
// mirrors in one data dir that file:// URLs never reach, and file://
// repositories allowed under the temporary folder (where gitRepo makes
// them, and where the data dir is too). It returns the data dir.
func newGitHarness(t *testing.T) (*harness, string) {
	t.Helper()
	data := t.TempDir()
	eng, err := gitws.New(gitws.Options{Root: filepath.Join(data, "git"), FileRoots: []string{os.TempDir()}, Denied: []string{data}})
	if err != nil {
		t.Fatal(err)
	}
	return newHarness(t, room.Options{Root: filepath.Join(data, "rooms"), Sources: roomgit.New(eng), Snapshots: snapshots(t)}, Options{}), data
}

// roomDir is the folder of room rm's own (name) under the data dir.
func roomDir(t *testing.T, data, rm, name string) string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(data, "rooms", rm+"-*", name))
	if err != nil || len(m) != 1 {
		t.Fatalf("room %s's %s: %v %v", rm, name, m, err)
	}
	return m[0]
}

// Rooms on one repository get their own worktrees at their refs before
// their first turn (workspace.ready says what), separate from each other;
// what git cannot give is a 400 at PUT when it can tell, and a room keeps
// its repository and ref.
func TestGitWorkspaces(t *testing.T) {
	url, commits := gitRepo(t)
	h, _ := newGitHarness(t)
	put := func(rm string, ws map[string]string) resp {
		return h.do("PUT", "/v1/rooms/"+rm+"/config", map[string]any{"workspace": ws})
	}
	for name, tc := range map[string]struct {
		ws   map[string]string
		want string
	}{
		"unreachable": {map[string]string{"git": "file:///nonexistent/repo", "ref": "main"}, "git: "},
		// git's cause, not the hint it ends with ("and the repository
		// exists.").
		"no repository": {map[string]string{"git": "file://" + t.TempDir() + "/none", "ref": "main"}, "does not appear to be a git repository"},
		"unknown ref":   {map[string]string{"git": url, "ref": "nope"}, `no branch or tag "nope"`},
		"no ref":        {map[string]string{"git": url}, "workspace needs git"},
		"a password":    {map[string]string{"git": "https://u:secret@example.invalid/r.git", "ref": "main"}, "credential helper"},
		"a token":       {map[string]string{"git": "https://secret@example.invalid/r.git", "ref": "main"}, "credential helper"},
		"ext helper":    {map[string]string{"git": "ext::sh -c touch% /tmp/pwned", "ref": "main"}, "git: "},
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
	if acc.Seq != 2 {
		// 1 is the new room's settings.changed.
		t.Fatalf("the new room's second event is %d", acc.Seq)
	}
	if d := h.ended("a", acc); d["outcome"] != "failed" {
		t.Fatalf("the new room has the old room's file: %v", d)
	}
	if d := h.ended("a", h.post("a", "read:README")); d["text"] != "feature\n" {
		t.Fatalf("the new room's workspace: %v", d)
	}
	// A room that already has files takes no checkout: the PUT says so
	// (every turn would fail), and the room goes on.
	if d := h.ended("c", h.post("c", "write:old.txt")); d["outcome"] != "settled" {
		t.Fatalf("room c: %v", d)
	}
	if r := put("c", map[string]string{"git": url, "ref": "main"}); r.status != http.StatusBadRequest ||
		!strings.Contains(string(r.body), "already holds files") || !strings.Contains(string(r.body), "?purge=true") {
		t.Fatalf("PUT c, a room with files: %d %s", r.status, r.body)
	}
	if d := h.ended("c", h.post("c", "read:old.txt")); d["outcome"] != "settled" {
		t.Fatalf("room c after the refused PUT: %v", d)
	}
}

// A room keeps the repository and ref of its first checkout: before it,
// a PUT may name another; after it, another is a 400 that says what the
// room holds, and settings without a workspace leave the room its
// checkout, which GET /config shows.
func TestGitWorkspaceLifecycle(t *testing.T) {
	a, _ := gitRepo(t)
	b, commits := gitRepo(t)
	h, _ := newGitHarness(t)
	put := func(body map[string]any) resp { return h.do("PUT", "/v1/rooms/w/config", body) }
	config := func() any {
		r := h.do("GET", "/v1/rooms/w/config", nil)
		if r.status != http.StatusOK {
			t.Fatalf("GET config: %d %s", r.status, r.body)
		}
		return r.json(t)["workspace"]
	}
	for _, ws := range []map[string]string{{"git": a, "ref": "main"}, {"git": b, "ref": "feature"}} {
		if r := put(map[string]any{"workspace": ws}); r.status != http.StatusOK {
			t.Fatalf("PUT %v before the first turn: %d %s", ws, r.status, r.body)
		}
	}
	if d := h.ended("w", h.post("w", "read:README")); d["text"] != "feature\n" {
		t.Fatalf("the first turn: %v", d)
	}
	ready := h.until("w", 0, func(ev sse) bool { return ev.typ == "workspace.ready" })
	if ready.data["url"] != b || ready.data["commit"] != commits["feature"] {
		t.Fatalf("workspace.ready %v, want the second PUT's", ready.data)
	}
	held := map[string]any{"git": b, "ref": "feature"}
	r := put(map[string]any{"workspace": map[string]string{"git": a, "ref": "main"}})
	if msg := string(r.body); r.status != http.StatusBadRequest || !strings.Contains(msg, "holds "+b+` at \"feature\"`) || !strings.Contains(msg, "purge=true") {
		t.Fatalf("another repository after the checkout: %d %s, want 400 naming what the room holds", r.status, r.body)
	}
	if got := config(); !reflect.DeepEqual(got, held) {
		t.Fatalf("GET config after a refused PUT: workspace %v", got)
	}
	// Settings without a workspace: the room keeps its checkout, and says so.
	if r := put(map[string]any{"instructions": "be brief"}); r.status != http.StatusOK || !reflect.DeepEqual(r.json(t)["workspace"], held) {
		t.Fatalf("PUT without a workspace: %d %s", r.status, r.body)
	}
	if got := config(); !reflect.DeepEqual(got, held) {
		t.Fatalf("GET config after settings without a workspace: workspace %v, want %v", got, held)
	}
	if d := h.ended("w", h.post("w", "read:README")); d["outcome"] != "settled" || d["text"] != "feature\n" {
		t.Fatalf("a turn after settings without a workspace: %v", d)
	}
	// Purged, the id is a new room that takes any.
	if r := h.do("DELETE", "/v1/rooms/w?purge=true", nil); r.status != http.StatusOK {
		t.Fatalf("purge: %d %s", r.status, r.body)
	}
	if r := put(map[string]any{"workspace": map[string]string{"git": a, "ref": "main"}}); r.status != http.StatusOK {
		t.Fatalf("PUT after the purge: %d %s", r.status, r.body)
	}
}

// A room's workspace can never be another room's: file:// URLs into the
// data dir (another room's snapshots repository, its workspace, a
// mirror) are refused at PUT, and a token in a URL is refused before it is
// stored or shown.
func TestGitWorkspaceCrossRoom(t *testing.T) {
	url, _ := gitRepo(t)
	h, data := newGitHarness(t)
	if r := h.do("PUT", "/v1/rooms/victim/config", map[string]any{"workspace": map[string]string{"git": url, "ref": "main"}}); r.status != http.StatusOK {
		t.Fatalf("PUT victim: %d %s", r.status, r.body)
	}
	if d := h.ended("victim", h.post("victim", "write:secret.txt")); d["outcome"] != "settled" {
		t.Fatalf("victim: %v", d)
	}
	mirrors, _ := filepath.Glob(filepath.Join(data, "git", "mirrors", "*.git"))
	for _, ws := range []map[string]string{
		{"git": "file://" + filepath.Join(roomDir(t, data, "victim", "snapshots"), "repo"), "ref": "snapshots"},
		{"git": "file://" + roomDir(t, data, "victim", "workspace"), "ref": "main"},
		{"git": "file://" + mirrors[0], "ref": "main"},
		{"git": "file://" + data, "ref": "main"},
	} {
		r := h.do("PUT", "/v1/rooms/thief/config", map[string]any{"workspace": ws})
		if r.status != http.StatusBadRequest || !strings.Contains(string(r.body), "server's own folders") {
			t.Errorf("PUT thief %v: %d %s", ws, r.status, r.body)
		}
	}
	if r := h.do("GET", "/v1/rooms/thief/config", nil); r.status != http.StatusNotFound {
		t.Errorf("the refused PUTs made room thief: %d %s", r.status, r.body)
	}
	token := "https://ghp_FAKE0123456789abcdefTOKEN@example.invalid/o/r.git"
	r := h.do("PUT", "/v1/rooms/victim/config", map[string]any{"workspace": map[string]string{"git": token, "ref": "main"}})
	if r.status != http.StatusBadRequest || strings.Contains(string(r.body), "ghp_") {
		t.Errorf("PUT of a token URL: %d %s", r.status, r.body)
	}
	if r := h.do("GET", "/v1/rooms/victim/config", nil); strings.Contains(string(r.body), "ghp_") {
		t.Errorf("GET config shows the token: %s", r.body)
	}
}
