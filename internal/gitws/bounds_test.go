package gitws_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agenthost/agenthost/internal/gitws"
)

// serverLayout is a server's folders as serve lays them out, all under one allowed root (the
// worst case: an operator who lists a folder that holds the data dir): DATA (denied, with the
// engine's Root in it), the rooms' workspaces (denied), and a victim room's snapshots
// repository (branch "snapshots") and workspace repository (branch "main"), both holding a
// secret.
type serverLayout struct {
	allowed, data, workspaces string
	snapshots, workspace      string // the victim's repositories
	good                      *repo  // a repository rooms may name
}

func newServerLayout(t *testing.T) *serverLayout {
	t.Helper()
	l := &serverLayout{allowed: filepath.Join(t.TempDir(), "allowed")}
	l.data = filepath.Join(l.allowed, "data")
	l.workspaces = filepath.Join(l.allowed, "workspaces")
	l.workspace = filepath.Join(l.workspaces, "victim")
	writeFile(t, filepath.Join(l.workspace, "secret.txt"), "TOP-SECRET\n")
	git(t, l.workspace, "init", "--quiet", "--initial-branch=main")
	git(t, l.workspace, "add", ".")
	git(t, l.workspace, "commit", "--quiet", "-m", "secret")
	l.snapshots = filepath.Join(l.data, "rooms", "victim", "snapshots", "repo")
	git(t, l.workspace, "init", "--quiet", "--bare", l.snapshots)
	git(t, l.workspace, "push", "--quiet", l.snapshots, "main:snapshots")
	good := newRepo(t)
	l.good = &repo{dir: filepath.Join(l.allowed, "good"), first: good.first, second: good.second, dev: good.dev}
	if err := os.Rename(good.dir, l.good.dir); err != nil {
		t.Fatal(err)
	}
	l.good.url = "file://" + l.good.dir
	return l
}

func (l *serverLayout) engine(t *testing.T) *gitws.Engine {
	return newEngine(t, gitws.Options{Root: filepath.Join(l.data, "git"), FileRoots: []string{l.allowed},
		Denied: []string{l.data, l.workspaces}})
}

// refused checks that neither Validate nor Prepare takes u, that the error says why, and that
// nothing was fetched.
func refused(t *testing.T, e *gitws.Engine, root, u, ref, says string) {
	t.Helper()
	ctx := tctx(t)
	if err := e.Validate(ctx, gitws.Spec{Git: u, Ref: ref}); !errors.Is(err, gitws.ErrBadSpec) || !strings.Contains(err.Error(), says) {
		t.Errorf("Validate(%s) = %v, want ErrBadSpec saying %q", u, err, says)
	}
	if _, err := e.Prepare(ctx, "thief", gitws.Spec{Git: u, Ref: ref}); !errors.Is(err, gitws.ErrBadSpec) {
		t.Errorf("Prepare(%s) = %v, want ErrBadSpec", u, err)
	}
	if got := entries(t, filepath.Join(root, "mirrors")); got != "[]" {
		t.Errorf("after refusing %s the mirrors hold %s", u, got)
	}
}

// TestEngine_FileRootsAndDenied: file:// URLs reach only repositories under Options.FileRoots,
// and never one in the server's own folders (another room's snapshots or workspace, the
// mirrors), whatever the roots say and whichever way the URL gets there: a link, "..", an
// escaped slash, a gitfile, alternates, a commondir, or the ".git" git adds to a missing path.
func TestEngine_FileRootsAndDenied(t *testing.T) {
	t.Parallel()
	l := newServerLayout(t)
	e := l.engine(t)
	root := filepath.Join(l.data, "git")
	if err := e.Validate(tctx(t), gitws.Spec{Git: l.good.url, Ref: "main"}); err != nil {
		t.Fatalf("a repository under the root: %v", err)
	}
	const own = "inside the server's own folders"
	refused(t, e, root, "file://"+l.snapshots, "snapshots", own)
	refused(t, e, root, "file://"+l.workspace, "main", own)
	refused(t, e, root, "file://"+l.workspace+"/.git", "main", own)
	refused(t, e, root, "file://"+l.data, "main", own)
	refused(t, e, root, "file://"+filepath.Join(root, "mirrors"), "main", own)
	refused(t, e, root, "file://"+strings.Replace(l.snapshots, "/rooms/", "%2Frooms/", 1), "snapshots", own)
	refused(t, e, root, "file://"+l.good.dir+"/../data/rooms/victim/snapshots/repo", "snapshots", `"." or ".."`)
	refused(t, e, root, "file://"+l.allowed+"/./workspaces/victim", "main", `"." or ".."`)

	// A link under the root into the workspaces.
	link := filepath.Join(l.allowed, "link")
	if err := os.Symlink(l.workspace, link); err != nil {
		t.Fatal(err)
	}
	refused(t, e, root, "file://"+link, "main", own)
	// A link above: the root itself reached through a link, then down into the data dir.
	up := filepath.Join(t.TempDir(), "up")
	if err := os.Symlink(l.allowed, up); err != nil {
		t.Fatal(err)
	}
	refused(t, e, root, "file://"+up+"/data/rooms/victim/snapshots/repo", "snapshots", own)
	// git opens PATH.git when PATH is missing: a link there.
	if err := os.Symlink(l.snapshots, filepath.Join(l.allowed, "sfx.git")); err != nil {
		t.Fatal(err)
	}
	refused(t, e, root, "file://"+filepath.Join(l.allowed, "sfx"), "snapshots", own)
	// A gitfile: a folder whose .git file leads into the workspaces.
	writeFile(t, filepath.Join(l.allowed, "gitfile", ".git"), "gitdir: "+filepath.Join(l.workspace, ".git")+"\n")
	refused(t, e, root, "file://"+filepath.Join(l.allowed, "gitfile"), "main", own)
	// A gitfile with a relative path.
	writeFile(t, filepath.Join(l.allowed, "relgitfile", ".git"), "gitdir: ../workspaces/victim/.git\n")
	refused(t, e, root, "file://"+filepath.Join(l.allowed, "relgitfile"), "main", own)
	// A repository of its own whose objects are borrowed from the victim's.
	alt := filepath.Join(l.allowed, "alt.git")
	git(t, l.allowed, "init", "--quiet", "--bare", alt)
	writeFile(t, filepath.Join(alt, "objects", "info", "alternates"), filepath.Join(l.workspace, ".git", "objects")+"\n")
	refused(t, e, root, "file://"+alt, "main", own)
	// Alternates two steps away.
	alt2 := filepath.Join(l.allowed, "alt2.git")
	git(t, l.allowed, "init", "--quiet", "--bare", alt2)
	writeFile(t, filepath.Join(alt2, "objects", "info", "alternates"), "../../alt.git/objects\n")
	refused(t, e, root, "file://"+alt2, "main", own)
	// A quoted alternates line (git unquotes it).
	altq := filepath.Join(l.allowed, "altq.git")
	git(t, l.allowed, "init", "--quiet", "--bare", altq)
	writeFile(t, filepath.Join(altq, "objects", "info", "alternates"), `"`+filepath.Join(l.workspace, ".git", "objects")+`"`+"\n")
	refused(t, e, root, "file://"+altq, "main", "quoted")
	// A linked worktree's git folder: its commondir is the victim's repository.
	cd := filepath.Join(l.allowed, "cd")
	writeFile(t, filepath.Join(cd, "HEAD"), "ref: refs/heads/main\n")
	writeFile(t, filepath.Join(cd, "commondir"), filepath.Join(l.workspace, ".git")+"\n")
	refused(t, e, root, "file://"+cd, "main", own)

	// Outside the roots; and no roots at all.
	other := newRepo(t)
	refused(t, e, root, other.url, "main", "allowed only under "+l.allowed)
	none := newEngine(t, gitws.Options{FileRoots: []string{}})
	if err := none.Validate(tctx(t), gitws.Spec{Git: l.good.url, Ref: "main"}); !errors.Is(err, gitws.ErrBadSpec) ||
		!strings.Contains(err.Error(), "not allowed on this server") {
		t.Errorf("file:// with no roots = %v, want ErrBadSpec", err)
	}
	// The good repository still opens, through a link under the root too.
	if err := os.Symlink(l.good.dir, filepath.Join(l.allowed, "goodlink")); err != nil {
		t.Fatal(err)
	}
	if err := e.Validate(tctx(t), gitws.Spec{Git: "file://" + filepath.Join(l.allowed, "goodlink"), Ref: "dev"}); err != nil {
		t.Errorf("a link under the root to a repository under it: %v", err)
	}
}

// TestEngine_AdmitAndHeld: what a room may be given before its checkout (an empty folder; once
// it holds a worktree, that repository and ref only) and what Held says it holds.
func TestEngine_AdmitAndHeld(t *testing.T) {
	t.Parallel()
	r := newRepo(t)
	e := newEngine(t, gitws.Options{})
	ctx := tctx(t)
	dir := filepath.Join(t.TempDir(), "ws")
	main := gitws.Spec{Git: r.url, Ref: "main"}
	if err := e.Admit(ctx, "room", dir, main); err != nil {
		t.Fatalf("a room with no folder yet: %v", err)
	}
	writeFile(t, filepath.Join(dir, "mine.txt"), "x")
	if err := e.Admit(ctx, "room", dir, main); !errors.Is(err, gitws.ErrNotEmpty) {
		t.Fatalf("a room with files = %v, want ErrNotEmpty", err)
	}
	if err := os.Remove(filepath.Join(dir, "mine.txt")); err != nil {
		t.Fatal(err)
	}
	if _, held, err := e.Held("room"); held || err != nil {
		t.Fatalf("Held before the checkout: %v %v", held, err)
	}
	if _, err := e.PrepareAt(ctx, "room", dir, main); err != nil {
		t.Fatal(err)
	}
	if spec, held, err := e.Held("room"); !held || err != nil || spec != main {
		t.Fatalf("Held = %+v %v %v, want %+v", spec, held, err, main)
	}
	if err := e.Admit(ctx, "room", dir, main); err != nil {
		t.Errorf("the same workspace again (its folder has the checkout): %v", err)
	}
	for _, other := range []gitws.Spec{{Git: r.url, Ref: "dev"}, {Git: newRepo(t).url, Ref: "main"}} {
		if err := e.Admit(ctx, "room", dir, other); !errors.Is(err, gitws.ErrSpecChanged) {
			t.Errorf("Admit(%+v) of a room holding main = %v, want ErrSpecChanged", other, err)
		}
	}
}
