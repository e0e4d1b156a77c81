package gitws_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/gitws"
)

func TestEngine_PrepareRefs(t *testing.T) {
	t.Parallel()
	r := newRepo(t)
	root := t.TempDir()
	e := newEngine(t, gitws.Options{Root: root})
	ctx := tctx(t)
	cases := []struct {
		room, ref, kind, commit, readme string
		devFile                         bool
	}{
		{"branch-main", "main", gitws.KindBranch, r.second, "second\n", false},
		{"branch-dev", "dev", gitws.KindBranch, r.dev, "first\n", true},
		{"tag", "v1", gitws.KindTag, r.first, "first\n", false},
		{"commit", r.dev, gitws.KindCommit, r.dev, "first\n", true},
		{"short commit", r.first[:10], gitws.KindCommit, r.first, "first\n", false},
	}
	for _, c := range cases {
		ready, err := e.Prepare(ctx, c.room, gitws.Spec{Git: r.url, Ref: c.ref})
		if err != nil {
			t.Fatalf("%s: %v", c.room, err)
		}
		if ready.URL != r.url || ready.Ref != c.ref || ready.Kind != c.kind || ready.Commit != c.commit {
			t.Errorf("%s: ready = %+v, want %s %s at %s", c.room, ready, c.kind, c.ref, c.commit)
		}
		if got := readFile(t, filepath.Join(ready.Dir, "README")); got != c.readme {
			t.Errorf("%s: README = %q, want %q", c.room, got, c.readme)
		}
		if got := exists(filepath.Join(ready.Dir, "dev.txt")); got != c.devFile {
			t.Errorf("%s: dev.txt there: %v, want %v", c.room, got, c.devFile)
		}
		// The room's tree is a repository at a detached HEAD on the commit, clean.
		if head := git(t, ready.Dir, "rev-parse", "HEAD"); head != c.commit {
			t.Errorf("%s: HEAD = %s", c.room, head)
		}
		if sym := git(t, ready.Dir, "rev-parse", "--abbrev-ref", "HEAD"); sym != "HEAD" {
			t.Errorf("%s: HEAD is on %q, want detached", c.room, sym)
		}
		if st := git(t, ready.Dir, "status", "--porcelain"); st != "" {
			t.Errorf("%s: status %q, want clean", c.room, st)
		}
		if got, ok, err := e.Get(c.room); err != nil || !ok || got != ready {
			t.Errorf("%s: Get = %+v %v %v", c.room, got, ok, err)
		}
	}
	if got := entries(t, filepath.Join(root, "mirrors")); strings.Count(got, ".git") != 1 {
		t.Errorf("mirrors: %s, want one for the one repository", got)
	}
}

func TestEngine_PrepareRoomsAreSeparate(t *testing.T) {
	t.Parallel()
	r := newRepo(t)
	e := newEngine(t, gitws.Options{})
	ctx := tctx(t)
	spec := gitws.Spec{Git: r.url, Ref: "main"}
	a, err := e.Prepare(ctx, "a", spec)
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Prepare(ctx, "b", spec)
	if err != nil {
		t.Fatal(err)
	}
	if a.Dir == b.Dir {
		t.Fatalf("both rooms in %s", a.Dir)
	}
	writeFile(t, filepath.Join(a.Dir, "only-in-a.txt"), "a\n")
	writeFile(t, filepath.Join(a.Dir, "README"), "changed in a\n")
	// A commit in one room reaches neither the other room nor the mirror it borrows from.
	git(t, a.Dir, "add", ".")
	git(t, a.Dir, "commit", "--quiet", "-m", "in a")
	if exists(filepath.Join(b.Dir, "only-in-a.txt")) || readFile(t, filepath.Join(b.Dir, "README")) != "second\n" {
		t.Error("a file written in room a shows in room b")
	}
	if st := git(t, b.Dir, "status", "--porcelain"); st != "" {
		t.Errorf("room b's status %q, want clean", st)
	}
	if head := git(t, b.Dir, "rev-parse", "HEAD"); head != r.second {
		t.Errorf("room b's HEAD moved to %s", head)
	}
}

func TestEngine_PrepareIdempotent(t *testing.T) {
	t.Parallel()
	r := newRepo(t)
	e := newEngine(t, gitws.Options{})
	ctx := tctx(t)
	spec := gitws.Spec{Git: r.url, Ref: "main"}
	first, err := e.Prepare(ctx, "room", spec)
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(first.Dir, "work.txt"), "in progress\n")
	// The branch moves upstream; the room keeps its checkout and its files.
	writeFile(t, filepath.Join(r.dir, "README"), "third\n")
	git(t, r.dir, "commit", "--quiet", "-am", "third")
	again, err := e.Prepare(ctx, "room", spec)
	if err != nil {
		t.Fatal(err)
	}
	if again != first {
		t.Errorf("second Prepare = %+v, want %+v", again, first)
	}
	if got := readFile(t, filepath.Join(first.Dir, "work.txt")); got != "in progress\n" {
		t.Errorf("work.txt = %q after the second Prepare", got)
	}
	// Another ref, or another repository, is refused without touching the room.
	other := newRepo(t)
	for _, s := range []gitws.Spec{{Git: r.url, Ref: "dev"}, {Git: other.url, Ref: "main"}} {
		if _, err := e.Prepare(ctx, "room", s); !errors.Is(err, gitws.ErrSpecChanged) {
			t.Errorf("Prepare(%+v) = %v, want ErrSpecChanged", s, err)
		}
	}
	if !exists(filepath.Join(first.Dir, "work.txt")) {
		t.Error("a refused Prepare removed the room's files")
	}
	// A worktree deleted from outside is made again.
	if err := os.RemoveAll(first.Dir); err != nil {
		t.Fatal(err)
	}
	remade, err := e.Prepare(ctx, "room", spec)
	if err != nil {
		t.Fatal(err)
	}
	if readFile(t, filepath.Join(remade.Dir, "README")) != "third\n" {
		t.Error("the remade worktree is not at the branch's new commit")
	}
}

func TestEngine_Validate(t *testing.T) {
	t.Parallel()
	r := newRepo(t)
	e := newEngine(t, gitws.Options{})
	ctx := tctx(t)
	closed := closedPort(t)
	cases := []struct {
		spec gitws.Spec
		want error
	}{
		{gitws.Spec{Git: r.url, Ref: "main"}, nil},
		{gitws.Spec{Git: r.url, Ref: "dev"}, nil},
		{gitws.Spec{Git: r.url, Ref: "v1"}, nil},
		// A commit id can only be checked by a fetch: Validate takes it.
		{gitws.Spec{Git: r.url, Ref: r.dev}, nil},
		{gitws.Spec{Git: r.url, Ref: "no-such-branch"}, gitws.ErrUnknownRef},
		{gitws.Spec{Git: "file://" + filepath.Join(t.TempDir(), "nothing"), Ref: "main"}, gitws.ErrUnreachable},
		{gitws.Spec{Git: "https://127.0.0.1:" + closed + "/repo.git", Ref: "main"}, gitws.ErrUnreachable},
		{gitws.Spec{Git: r.dir, Ref: "main"}, gitws.ErrBadSpec},
		{gitws.Spec{Git: r.url, Ref: "main~1"}, gitws.ErrBadSpec},
	}
	for _, c := range cases {
		err := e.Validate(ctx, c.spec)
		if !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("Validate(%+v) = %v, want %v", c.spec, err, c.want)
		}
		if errors.Is(err, gitws.ErrUnreachable) && !strings.Contains(err.Error(), "git ls-remote") {
			t.Errorf("the error %q does not name the git step", err)
		}
	}
}

// closedPort returns a 127.0.0.1 port where nothing listens.
func closedPort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	ln.Close()
	return port
}

func TestEngine_PrepareFailuresLeaveNothing(t *testing.T) {
	t.Parallel()
	r := newRepo(t)
	root := t.TempDir()
	e := newEngine(t, gitws.Options{Root: root})
	ctx := tctx(t)
	cases := []struct {
		spec gitws.Spec
		want error
		says string
	}{
		{gitws.Spec{Git: r.url, Ref: "no-such-branch"}, gitws.ErrUnknownRef, `no branch or tag "no-such-branch"`},
		{gitws.Spec{Git: r.url, Ref: strings.Repeat("ab", 20)}, gitws.ErrUnknownRef, "no branch, tag or commit"},
		{gitws.Spec{Git: "file://" + filepath.Join(t.TempDir(), "nothing"), Ref: "main"}, gitws.ErrUnreachable, "gitws: git ls-remote file://"},
		{gitws.Spec{Git: "https://127.0.0.1:" + closedPort(t) + "/repo.git", Ref: "main"}, gitws.ErrUnreachable, "gitws: git ls-remote https://127.0.0.1"},
	}
	for _, c := range cases {
		_, err := e.Prepare(ctx, "room", c.spec)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.says) {
			t.Errorf("Prepare(%+v) = %v, want %v saying %q", c.spec, err, c.want, c.says)
		}
		for _, d := range []string{"mirrors", "rooms", "worktrees"} {
			if got := entries(t, filepath.Join(root, d)); got != "" && got != "[]" {
				t.Errorf("Prepare(%+v) failed and left %s in %s", c.spec, got, d)
			}
		}
		if _, ok, _ := e.Get("room"); ok {
			t.Errorf("Prepare(%+v) failed and Get reports a worktree", c.spec)
		}
	}
}

func TestEngine_PrepareNotEmpty(t *testing.T) {
	t.Parallel()
	r := newRepo(t)
	ws := filepath.Join(t.TempDir(), "ws")
	e := newEngine(t, gitws.Options{Worktree: func(string) string { return ws }})
	writeFile(t, filepath.Join(ws, "mine.txt"), "user data\n")
	if _, err := e.Prepare(tctx(t), "room", gitws.Spec{Git: r.url, Ref: "main"}); !errors.Is(err, gitws.ErrNotEmpty) {
		t.Fatalf("Prepare into a folder with files = %v, want ErrNotEmpty", err)
	}
	if readFile(t, filepath.Join(ws, "mine.txt")) != "user data\n" {
		t.Error("the folder's own files were touched")
	}
	// An empty folder is taken.
	if err := os.Remove(filepath.Join(ws, "mine.txt")); err != nil {
		t.Fatal(err)
	}
	ready, err := e.Prepare(tctx(t), "room", gitws.Spec{Git: r.url, Ref: "main"})
	if err != nil || ready.Dir != ws {
		t.Fatalf("Prepare into an empty folder = %+v, %v", ready, err)
	}
}

func TestEngine_ConcurrentPrepares(t *testing.T) {
	t.Parallel()
	r := newRepo(t)
	// A git that fails a fetch of a ref of a mirror while another fetch of that ref runs: the
	// engine must never overlap two fetches of one ref (rooms on the same ref share one).
	e := newEngine(t, gitws.Options{Git: exclusiveFetchGit(t)})
	ctx := tctx(t)
	rooms := []string{"one", "two", "three", "four"}
	readies := make([]gitws.Ready, len(rooms))
	errs := make([]error, len(rooms))
	var wg sync.WaitGroup
	for i, room := range rooms {
		wg.Go(func() {
			ref := "main"
			if i%2 == 1 {
				ref = "dev"
			}
			readies[i], errs[i] = e.Prepare(ctx, room, gitws.Spec{Git: r.url, Ref: ref})
		})
	}
	wg.Wait()
	dirs := map[string]bool{}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("room %s: %v", rooms[i], err)
		}
		want := r.second
		if i%2 == 1 {
			want = r.dev
		}
		if readies[i].Commit != want || git(t, readies[i].Dir, "rev-parse", "HEAD") != want {
			t.Errorf("room %s: %+v, want commit %s", rooms[i], readies[i], want)
		}
		dirs[readies[i].Dir] = true
	}
	if len(dirs) != len(rooms) {
		t.Errorf("%d folders for %d rooms", len(dirs), len(rooms))
	}
}

// exclusiveFetchGit writes a git wrapper whose fetches take a lock file exclusively (failing if
// another fetch of the same refs into the same mirror holds it) and hold it a moment, so
// overlapping fetches of one ref fail.
func exclusiveFetchGit(t *testing.T) string {
	real, err := execLookGit()
	if err != nil {
		t.Fatal(err)
	}
	script := `#!/bin/sh
case " $* " in
*" fetch "*)
	for a in "$@"; do case "$a" in --git-dir=*) d="${a#--git-dir=}";; esac; done
	lock="$d/fetch-$(printf '%s' "$*" | cksum | cut -d' ' -f1)"
	set -C
	if ! : > "$lock" 2>/dev/null; then echo "overlapping fetch" >&2; exit 99; fi
	set +C
	sleep 0.2
	"` + real + `" "$@"; rc=$?
	rm -f "$lock"
	exit $rc;;
esac
exec "` + real + `" "$@"
`
	p := filepath.Join(t.TempDir(), "git")
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestEngine_Remove(t *testing.T) {
	t.Parallel()
	r := newRepo(t)
	root := t.TempDir()
	e := newEngine(t, gitws.Options{Root: root})
	ctx := tctx(t)
	a, err := e.Prepare(ctx, "a", gitws.Spec{Git: r.url, Ref: "main"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.Prepare(ctx, "b", gitws.Spec{Git: r.url, Ref: "dev"})
	if err != nil {
		t.Fatal(err)
	}
	// Read-only folders (a Go module cache, say) do not stop the removal.
	writeFile(t, filepath.Join(a.Dir, "ro", "file"), "x")
	if err := os.Chmod(filepath.Join(a.Dir, "ro"), 0o500); err != nil {
		t.Fatal(err)
	}
	if err := e.Remove(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if exists(a.Dir) {
		t.Error("room a's worktree is still there")
	}
	if _, ok, _ := e.Get("a"); ok {
		t.Error("Get still reports room a")
	}
	if got := entries(t, filepath.Join(root, "mirrors")); strings.Count(got, ".git") != 1 {
		t.Errorf("mirrors after removing a: %s, want the one room b borrows from", got)
	}
	// Room b is whole: its objects are borrowed from the mirror.
	if out := git(t, b.Dir, "log", "--format=%H", "-1"); out != r.dev {
		t.Errorf("room b's log = %q", out)
	}
	if err := e.Remove(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"mirrors", "rooms", "worktrees"} {
		if got := entries(t, filepath.Join(root, d)); got != "" && got != "[]" {
			t.Errorf("after removing every room, %s holds %s", d, got)
		}
	}
	// Removing a room without a worktree does nothing; a removed room can be prepared again.
	if err := e.Remove(ctx, "never-prepared"); err != nil {
		t.Errorf("Remove of a room without a worktree = %v", err)
	}
	if _, err := e.Prepare(ctx, "a", gitws.Spec{Git: r.url, Ref: "dev"}); err != nil {
		t.Errorf("Prepare after Remove: %v", err)
	}
}

// TestEngine_ContextKillsGit: a server that accepts the connection and never answers would hold
// git forever; the caller's context ends it, and git (with its helpers) is killed.
func TestEngine_ContextKillsGit(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			closed <- err
			return
		}
		defer c.Close()
		// Read (git's TLS hello) until git's side closes: its death.
		_, err = io.Copy(io.Discard, c)
		closed <- err
	}()
	e := newEngine(t, gitws.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err = e.Prepare(ctx, "room", gitws.Spec{Git: "https://" + ln.Addr().String() + "/repo.git", Ref: "main"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Prepare = %v, want the context's deadline", err)
	}
	var ge *gitws.GitError
	if !errors.As(err, &ge) || ge.Op != "ls-remote" {
		t.Errorf("error %v is not a *GitError of the first network step", err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("connection: %v", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("git still holds its connection after the context ended")
	}
}

// TestEngine_NothingRunsFromConfig: the host's configuration names hooks (for checkout and for
// ref updates) and a filter the repository's attributes use; preparing a room runs none of them.
func TestEngine_NothingRunsFromConfig(t *testing.T) {
	t.Parallel()
	r := newRepo(t)
	writeFile(t, filepath.Join(r.dir, ".gitattributes"), "* filter=evil\n")
	git(t, r.dir, "add", ".")
	git(t, r.dir, "commit", "--quiet", "-m", "attributes")

	home := t.TempDir()
	marks := t.TempDir()
	hooks := filepath.Join(home, "hooks")
	for _, h := range []string{"post-checkout", "reference-transaction", "post-index-change"} {
		writeFile(t, filepath.Join(hooks, h), "#!/bin/sh\ntouch "+filepath.Join(marks, h)+"\n")
		if err := os.Chmod(filepath.Join(hooks, h), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	writeFile(t, filepath.Join(home, ".gitconfig"), "[core]\n\thooksPath = "+hooks+"\n\tfsmonitor = touch "+
		filepath.Join(marks, "fsmonitor")+"\n[filter \"evil\"]\n\tsmudge = touch "+filepath.Join(marks, "smudge")+
		"\n\tprocess = touch "+filepath.Join(marks, "process")+"\n")
	env := []string{"HOME=" + home, "PATH=" + os.Getenv("PATH")}
	e := newEngine(t, gitws.Options{Env: env})
	ready, err := e.Prepare(tctx(t), "room", gitws.Spec{Git: r.url, Ref: "main"})
	if err != nil {
		t.Fatal(err)
	}
	if !exists(filepath.Join(ready.Dir, ".gitattributes")) {
		t.Fatal("the checkout lacks the repository's files")
	}
	if got := entries(t, marks); got != "[]" {
		t.Errorf("programs from the configuration ran: %s", got)
	}
}

func TestEngine_BadSpecs(t *testing.T) {
	t.Parallel()
	e := newEngine(t, gitws.Options{})
	ctx := tctx(t)
	bad := []gitws.Spec{
		{Git: "ext::sh -c touch% /tmp/pwned", Ref: "main"},
		{Git: "ext::sh", Ref: "main"},
		{Git: "fd::3", Ref: "main"},
		{Git: "/srv/repo", Ref: "main"},
		{Git: "./repo", Ref: "main"},
		{Git: "repo", Ref: "main"},
		{Git: "-uhelp", Ref: "main"},
		{Git: "--upload-pack=touch /tmp/pwned", Ref: "main"},
		{Git: "ssh://-oProxyCommand=touch/x", Ref: "main"},
		{Git: "-oProxyCommand=x:repo", Ref: "main"},
		{Git: "host:-repo", Ref: "main"},
		{Git: "git://example.com/repo.git", Ref: "main"},
		{Git: "http://example.com/repo.git", Ref: "main"},
		{Git: "https://user:secret@example.com/repo.git", Ref: "main"},
		{Git: "https://example.com/", Ref: "main"},
		{Git: "file://example.com/srv/repo", Ref: "main"},
		{Git: "file://relative", Ref: "main"},
		{Git: `C:\repo`, Ref: "main"},
		{Git: "https://example.com/repo.git\n", Ref: "main"},
		{Git: "", Ref: "main"},
		{Git: "https://example.com/repo.git", Ref: ""},
		{Git: "https://example.com/repo.git", Ref: "-x"},
		{Git: "https://example.com/repo.git", Ref: "--upload-pack=x"},
		{Git: "https://example.com/repo.git", Ref: "HEAD~1"},
		{Git: "https://example.com/repo.git", Ref: "main^"},
		{Git: "https://example.com/repo.git", Ref: "a..b"},
		{Git: "https://example.com/repo.git", Ref: "main@{1}"},
		{Git: "https://example.com/repo.git", Ref: "main:README"},
		{Git: "https://example.com/repo.git", Ref: "a b"},
		{Git: "https://example.com/repo.git", Ref: ".hidden"},
		{Git: "https://example.com/repo.git", Ref: "x.lock"},
		{Git: "https://example.com/repo.git", Ref: "HEAD"},
	}
	for _, s := range bad {
		if err := e.Validate(ctx, s); !errors.Is(err, gitws.ErrBadSpec) {
			t.Errorf("Validate(%q, %q) = %v, want ErrBadSpec", s.Git, s.Ref, err)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("the error %q shows the password", err)
		}
		if _, err := e.Prepare(ctx, "room", s); !errors.Is(err, gitws.ErrBadSpec) {
			t.Errorf("Prepare(%q, %q) = %v, want ErrBadSpec", s.Git, s.Ref, err)
		}
	}
	if _, err := e.Prepare(ctx, "", gitws.Spec{Git: "https://example.com/r.git", Ref: "main"}); !errors.Is(err, gitws.ErrBadSpec) {
		t.Errorf("Prepare of an empty room id = %v, want ErrBadSpec", err)
	}
}

// TestEngine_ErrorsRedactUserinfo: credentials in a URL are refused without being shown
// (a token as an https user name, the usual form for GitHub and GitLab), and an ssh user name,
// which is kept, is not shown in errors either.
func TestEngine_ErrorsRedactUserinfo(t *testing.T) {
	t.Parallel()
	e := newEngine(t, gitws.Options{})
	ctx := tctx(t)
	port := closedPort(t)
	for _, u := range []string{"https://ghp_FAKE0123456789abcdefTOKEN@127.0.0.1:" + port + "/repo.git",
		"https://oauth2:glpat-FAKETOKEN@127.0.0.1:" + port + "/repo.git",
		"https://ghp_FAKE0123456789abcdefTOKEN@github.com/o/r.git",
		"file://token-FAKE@" + t.TempDir(),
		"ssh://git:FAKETOKEN@127.0.0.1:" + port + "/repo.git"} {
		for name, err := range map[string]error{
			"Validate": e.Validate(ctx, gitws.Spec{Git: u, Ref: "main"}),
			"Prepare":  func() error { _, err := e.Prepare(ctx, "room", gitws.Spec{Git: u, Ref: "main"}); return err }(),
		} {
			if !errors.Is(err, gitws.ErrBadSpec) || !strings.Contains(err.Error(), "credential helper") {
				t.Errorf("%s(%s) = %v, want ErrBadSpec saying how to give credentials", name, u, err)
			}
			if strings.Contains(err.Error(), "FAKE") {
				t.Errorf("%s: the error shows the credentials: %v", name, err)
			}
		}
	}
	u := "ssh://token-abc123@127.0.0.1:" + port + "/repo.git"
	if err := e.Validate(ctx, gitws.Spec{Git: u, Ref: "main"}); !errors.Is(err, gitws.ErrUnreachable) || strings.Contains(err.Error(), "token-abc123") {
		t.Errorf("Validate(%s) = %v, want ErrUnreachable without the user name", u, err)
	}
	if got := gitws.Redact("fatal: unable to access 'https://me:pw@example.com/r.git/': 403"); strings.Contains(got, "me:pw") {
		t.Errorf("Redact left the userinfo: %s", got)
	}
}

// TestEngine_FileURLBounds: a file:// URL cannot name another room's worktree or a mirror (a room
// is a boundary), and FileRoots, when set, bounds where file:// repositories may be.
func TestEngine_FileURLBounds(t *testing.T) {
	t.Parallel()
	r := newRepo(t)
	root := t.TempDir()
	e := newEngine(t, gitws.Options{Root: root})
	ctx := tctx(t)
	a, err := e.Prepare(ctx, "a", gitws.Spec{Git: r.url, Ref: "main"})
	if err != nil {
		t.Fatal(err)
	}
	mirrors, err := filepath.Glob(filepath.Join(root, "mirrors", "*.git"))
	if err != nil || len(mirrors) != 1 {
		t.Fatalf("mirrors: %v %v", mirrors, err)
	}
	for _, u := range []string{"file://" + a.Dir, "file://" + mirrors[0], "file://" + root + "/worktrees/../worktrees/" + filepath.Base(a.Dir)} {
		if _, err := e.Prepare(ctx, "b", gitws.Spec{Git: u, Ref: "main"}); !errors.Is(err, gitws.ErrBadSpec) {
			t.Errorf("Prepare from %s = %v, want ErrBadSpec", u, err)
		}
	}
	// Through a symbolic link too.
	link := filepath.Join(t.TempDir(), "link")
	if err := os.Symlink(a.Dir, link); err != nil {
		t.Fatal(err)
	}
	if err := e.Validate(ctx, gitws.Spec{Git: "file://" + link, Ref: "main"}); !errors.Is(err, gitws.ErrBadSpec) {
		t.Errorf("Validate through a link into the root = %v, want ErrBadSpec", err)
	}

	bounded := newEngine(t, gitws.Options{FileRoots: []string{r.dir}})
	if err := bounded.Validate(ctx, gitws.Spec{Git: r.url, Ref: "main"}); err != nil {
		t.Errorf("a repository under FileRoots: %v", err)
	}
	other := newRepo(t)
	if err := bounded.Validate(ctx, gitws.Spec{Git: other.url, Ref: "main"}); !errors.Is(err, gitws.ErrBadSpec) {
		t.Errorf("a repository outside FileRoots = %v, want ErrBadSpec", err)
	}
}

// PrepareAt puts a room's worktree where the caller says, names the
// mirror it borrows from, and Held tells what a room's worktree holds
// (another spec would be ErrSpecChanged).
func TestEngine_PrepareAtAndHeld(t *testing.T) {
	r := newRepo(t)
	e := newEngine(t, gitws.Options{})
	ctx := tctx(t)
	dir := filepath.Join(t.TempDir(), "ws")
	main := gitws.Spec{Git: r.url, Ref: "main"}
	if _, has, err := e.Held("room"); has || err != nil {
		t.Fatalf("Held before: %v %v", has, err)
	}
	if _, err := e.PrepareAt(ctx, "room", "relative/dir", main); !errors.Is(err, gitws.ErrBadSpec) {
		t.Fatalf("a relative folder: %v", err)
	}
	ready, err := e.PrepareAt(ctx, "room", dir, main)
	if err != nil {
		t.Fatal(err)
	}
	if ready.Dir != dir || ready.Commit != r.second || readFile(t, filepath.Join(dir, "README")) != "second\n" {
		t.Fatalf("ready %+v", ready)
	}
	if fi, err := os.Stat(filepath.Join(ready.Mirror, "objects")); err != nil || !fi.IsDir() {
		t.Fatalf("the mirror %q: %v", ready.Mirror, err)
	}
	if again, err := e.PrepareAt(ctx, "room", dir, main); err != nil || again != ready {
		t.Fatalf("again: %+v %v, first %+v", again, err, ready)
	}
	if spec, has, err := e.Held("room"); !has || spec != main || err != nil {
		t.Fatalf("Held: %+v %v %v", spec, has, err)
	}
	if _, err := e.PrepareAt(ctx, "room", dir, gitws.Spec{Git: r.url, Ref: "dev"}); !errors.Is(err, gitws.ErrSpecChanged) {
		t.Fatalf("another ref: %v, want ErrSpecChanged", err)
	}
	if err := e.Remove(ctx, "room"); err != nil {
		t.Fatal(err)
	}
	if _, has, err := e.Held("room"); has || err != nil || exists(dir) {
		t.Fatalf("after Remove: %v %v, folder left: %v", has, err, exists(dir))
	}
}
