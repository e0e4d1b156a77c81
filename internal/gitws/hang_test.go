//go:build unix

package gitws_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agenthost/agenthost/internal/gitws"
)

// hungRepo is a repository whose branch "hang" cannot be fetched: the blob its commit adds is
// a FIFO in place of a loose object, so the upload-pack a fetch starts blocks opening it for as
// long as nobody writes. main fetches fine.
func hungRepo(t *testing.T) *repo {
	t.Helper()
	r := newRepo(t)
	git(t, r.dir, "checkout", "--quiet", "-b", "hang")
	writeFile(t, filepath.Join(r.dir, "hang.txt"), "never sent\n")
	git(t, r.dir, "add", ".")
	git(t, r.dir, "commit", "--quiet", "-m", "hang")
	blob := git(t, r.dir, "rev-parse", "HEAD:hang.txt")
	git(t, r.dir, "checkout", "--quiet", "main")
	obj := filepath.Join(r.dir, ".git", "objects", blob[:2], blob[2:])
	if err := os.Remove(obj); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(obj, 0o600); err != nil {
		t.Fatal(err)
	}
	return r
}

// signallingGit writes a git wrapper that, for each fetch of refs/heads/hang, appends a line to
// log and then writes a line into the FIFO signal (blocking until the test reads it), so the
// test knows the fetch began, and how many began.
func signallingGit(t *testing.T) (gitPath, log, signal string) {
	t.Helper()
	real, err := execLookGit()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	log, signal = filepath.Join(dir, "fetches"), filepath.Join(dir, "signal")
	if err := syscall.Mkfifo(signal, 0o600); err != nil {
		t.Fatal(err)
	}
	script := `#!/bin/sh
case " $* " in
*" fetch "*refs/heads/hang*) echo fetch >> "` + log + `"; echo started > "` + signal + `";;
esac
exec "` + real + `" "$@"
`
	gitPath = filepath.Join(dir, "git")
	if err := os.WriteFile(gitPath, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return gitPath, log, signal
}

// TestEngine_HungFetchHoldsUpNoOne: while one room's fetch of a ref hangs, another room's first
// checkout of a ref the mirror has succeeds, a room already on the repository is removed, and a
// room that wants the hung ref shares that fetch and leaves it when its own deadline comes
// (running no second fetch); the hung room's prepare ends with its own context and leaves the
// mirror to the others.
func TestEngine_HungFetchHoldsUpNoOne(t *testing.T) {
	t.Parallel()
	r := hungRepo(t)
	gitPath, log, signal := signallingGit(t)
	root := t.TempDir()
	e := newEngine(t, gitws.Options{Root: root, Git: gitPath})
	ctx := tctx(t)
	if _, err := e.Prepare(ctx, "early", gitws.Spec{Git: r.url, Ref: "main"}); err != nil {
		t.Fatal(err)
	}

	hangCtx, hangCancel := context.WithCancel(ctx)
	defer hangCancel()
	hangDone := make(chan error, 1)
	go func() {
		_, err := e.Prepare(hangCtx, "hang", gitws.Spec{Git: r.url, Ref: "hang"})
		hangDone <- err
	}()
	// The fetch began (the wrapper blocks writing its line until it is read).
	sig, err := os.Open(signal)
	if err != nil {
		t.Fatal(err)
	}
	if b := make([]byte, 8); func() bool { n, _ := sig.Read(b); return n == 0 }() {
		t.Fatal("no signal from the fetch")
	}
	sig.Close()
	if spec, held, err := e.Held("hang"); !held || err != nil || spec.Ref != "hang" {
		t.Errorf("Held of the room being prepared = %+v %v %v", spec, held, err)
	}

	// A first checkout of main, which the mirror has: no wait for the hung fetch.
	late, err := e.Prepare(ctx, "late", gitws.Spec{Git: r.url, Ref: "main"})
	if err != nil || late.Commit != r.second {
		t.Fatalf("late, on main, while hang's fetch hangs: %+v %v", late, err)
	}
	// A room on the repository is removed; the mirror stays for the others.
	if err := e.Remove(ctx, "early"); err != nil {
		t.Fatalf("Remove while another room's fetch hangs: %v", err)
	}
	// A room that wants the hung ref waits for that fetch, as long as its own deadline.
	joinCtx, joinCancel := context.WithTimeout(ctx, 5*time.Second)
	defer joinCancel()
	if _, err := e.Prepare(joinCtx, "joiner", gitws.Spec{Git: r.url, Ref: "hang"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a room joining the hung fetch = %v, want its own deadline", err)
	}
	select {
	case err := <-hangDone:
		t.Fatalf("the hung prepare ended by itself: %v", err)
	default:
	}
	if got := strings.Count(readFile(t, log), "fetch"); got != 1 {
		t.Errorf("%d fetches of the hung ref began, want 1 (the joiner shares it)", got)
	}
	// The hung room's own context ends its prepare, which leaves nothing of its own behind.
	hangCancel()
	if err := <-hangDone; !errors.Is(err, context.Canceled) {
		t.Errorf("the hung prepare = %v, want the context's cancel", err)
	}
	for _, rm := range []string{"hang", "joiner"} {
		if _, held, _ := e.Held(rm); held {
			t.Errorf("room %s holds a worktree after its failed prepare", rm)
		}
	}
	if got := entries(t, filepath.Join(root, "mirrors")); strings.Count(got, ".git") != 1 {
		t.Errorf("mirrors: %s, want the one late borrows from", got)
	}
	if out := git(t, late.Dir, "log", "--format=%H", "-1"); out != r.second {
		t.Errorf("late's worktree after the others left: %q", out)
	}
}
