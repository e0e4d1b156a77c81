package snapshot

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A workspace that is the user's git repository: snapshots, diffs and
// restores leave every byte of its .git (index, HEAD, branches, refs,
// config, objects) untouched, modification times included, and never
// record it.
func TestRepo_GitRepositoryUntouched(t *testing.T) {
	ctx := testCtx(t)
	ws := t.TempDir()
	userGit(t, ws, "init", "-q", "-b", "main")
	write(t, ws, "a.txt", "a\n")
	write(t, ws, "lib/b.txt", "b\n")
	userGit(t, ws, "add", ".")
	userGit(t, ws, "commit", "-q", "-m", "first")
	userGit(t, ws, "branch", "feature")
	userGit(t, ws, "tag", "v1")
	write(t, ws, "a.txt", "a staged\n")
	userGit(t, ws, "add", "a.txt") // the user's index differs from HEAD
	write(t, ws, "a.txt", "a staged, then edited\n")
	write(t, ws, "untracked.txt", "u\n")
	gitBefore := fingerprint(t, filepath.Join(ws, ".git"))

	r := openRepo(t, ws, Options{})
	before, _ := snap(t, r)
	for p := range treeOf(t, r, before) {
		if p == ".git" || strings.HasPrefix(p, ".git/") {
			t.Errorf("the snapshot recorded %s", p)
		}
	}
	write(t, ws, "a.txt", "agent\n")
	remove(t, ws, "lib")
	write(t, ws, "new.txt", "n\n")
	after, _ := snap(t, r)
	if _, err := r.Diff(ctx, before, after, Limits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Restore(ctx, before); err != nil {
		t.Fatal(err)
	}
	if got := state(t, ws, false)["a.txt"]; got != "file 0644 a staged, then edited\n" {
		t.Errorf("a.txt after the restore: %q", got)
	}
	sameState(t, "the workspace's .git", gitBefore, fingerprint(t, filepath.Join(ws, ".git")))
}

// A workspace that is a git worktree (its .git a file naming the main
// repository's worktrees/<name>): the main repository's .git, the
// worktree's own index and HEAD, and the .git file are untouched.
func TestRepo_GitWorktreeUntouched(t *testing.T) {
	ctx := testCtx(t)
	base := t.TempDir()
	main := filepath.Join(base, "main")
	write(t, main, "a.txt", "a\n")
	userGit(t, main, "init", "-q", "-b", "main")
	userGit(t, main, "add", ".")
	userGit(t, main, "commit", "-q", "-m", "first")
	ws := filepath.Join(base, "wt")
	userGit(t, main, "worktree", "add", "-q", "-b", "room", ws)
	write(t, ws, "b.txt", "b\n")
	gitBefore := fingerprint(t, filepath.Join(main, ".git"))
	linkBefore, err := os.ReadFile(filepath.Join(ws, ".git"))
	if err != nil {
		t.Fatal(err)
	}

	r := openRepo(t, ws, Options{})
	before, _ := snap(t, r)
	if rec := treeOf(t, r, before); len(rec) != 2 || rec[".git"] != "" {
		t.Errorf("recorded %v, want a.txt and b.txt", rec)
	}
	write(t, ws, "a.txt", "agent\n")
	remove(t, ws, "b.txt")
	after, _ := snap(t, r)
	if _, err := r.Diff(ctx, before, after, Limits{}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Restore(ctx, before); err != nil {
		t.Fatal(err)
	}
	if got := state(t, ws, false); got["a.txt"] != "file 0644 a\n" || got["b.txt"] != "file 0644 b\n" {
		t.Errorf("worktree after the restore: %v", got)
	}
	sameState(t, "the main repository's .git", gitBefore, fingerprint(t, filepath.Join(main, ".git")))
	if link, err := os.ReadFile(filepath.Join(ws, ".git")); err != nil || string(link) != string(linkBefore) {
		t.Errorf("the worktree's .git file: %q, %v; want %q", link, err, linkBefore)
	}
}

// Symbolic links are recorded as links and restored as links, and a
// restore never writes through one: not through a link the turn put in
// place of a directory, nor through an ignored one.
func TestRepo_Symlinks(t *testing.T) {
	ctx := testCtx(t)
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	// The same names as the workspace's, so following a link would find
	// (and overwrite) something.
	write(t, outside, "f.txt", "outside\n")
	write(t, outside, "g.txt", "outside\n")
	outsideBefore := state(t, outside, true)
	ws := filepath.Join(base, "ws")
	write(t, ws, "dir/f.txt", "f\n")
	write(t, ws, "gen/g.txt", "g\n")
	symlink(t, ws, "abs", outside)
	symlink(t, ws, "rel", "dir/f.txt")
	symlink(t, ws, "dangling", "no/such")
	r := openRepo(t, ws, Options{})
	before, _ := snap(t, r)
	rec := treeOf(t, r, before)
	for _, p := range []string{"abs", "rel", "dangling"} {
		if rec[p] != "120000" {
			t.Errorf("%s recorded with mode %q, want a link (120000)", p, rec[p])
		}
	}
	if rec["abs/f.txt"] != "" || blobOf(t, r, before, "abs") != outside {
		t.Errorf("the link to outside was followed or mis-recorded: %v", rec)
	}
	stateBefore := state(t, ws, false)

	// The turn puts links to outside in place of a directory and of an
	// (afterwards ignored) directory, and removes the others.
	remove(t, ws, "dir")
	symlink(t, ws, "dir", outside)
	remove(t, ws, "gen")
	symlink(t, ws, "gen", outside)
	write(t, ws, ".gitignore", "gen\n")
	remove(t, ws, "abs")
	remove(t, ws, "rel")
	remove(t, ws, "dangling")
	snap(t, r)

	res, err := r.Restore(ctx, before)
	if err != nil {
		t.Fatal(err)
	}
	sameState(t, "outside the workspace", outsideBefore, state(t, outside, true))
	// gen is ignored now, and its link (never recorded) stands where the
	// snapshot's gen/g.txt goes: the link goes (not what it points at),
	// and gen/g.txt comes back.
	sameState(t, "workspace after the restore", stateBefore, state(t, ws, false))
	if len(res.Kept) != 0 || !slices.Contains(res.Paths, "gen") || !slices.Contains(res.Paths, "gen/g.txt") {
		t.Errorf("restored %v, kept %v: want gen replaced and gen/g.txt restored", res.Paths, res.Kept)
	}
}

// Names with spaces, tabs, newlines, quotes, backslashes, leading dashes
// and non-ASCII letters are recorded, listed and restored as they are.
func TestRepo_OddNames(t *testing.T) {
	ctx := testCtx(t)
	ws := t.TempDir()
	names := []string{"sp ace.txt", "tab\there.txt", "new\nline.txt", `quote".txt`, `back\slash.txt`, "-dash.txt",
		"--output=x", ":colon", "ünïcödé/日本.txt", " lead", "trail "}
	r := openRepo(t, ws, Options{})
	empty, _ := snap(t, r)
	for i, n := range names {
		write(t, ws, n, fmt.Sprintf("content of file %d\n", i))
	}
	full, _ := snap(t, r)
	d, err := r.Diff(ctx, empty, full, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range d.Files {
		if f.Status != StatusAdded || f.Insertions != 1 {
			t.Errorf("%q: %+v", f.Path, f)
		}
		got = append(got, f.Path)
	}
	want := slices.Clone(names)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("diff lists %q, want %q", got, want)
	}
	stateFull := state(t, ws, false)
	if _, err := r.Restore(ctx, empty); err != nil {
		t.Fatal(err)
	}
	if got := state(t, ws, false); len(got) != 0 {
		t.Errorf("after restoring the empty snapshot: %v", got)
	}
	if _, err := r.Restore(ctx, full); err != nil {
		t.Fatal(err)
	}
	sameState(t, "after restoring the full snapshot", stateFull, state(t, ws, false))
}
