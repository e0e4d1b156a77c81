package snapshot

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// A turn's edits in a plain folder: the diff names each file with its
// status and line counts, binary files are named and not inlined, and
// restoring brings back the earlier state exactly (and the later one
// again).
func TestRepo_SnapshotDiffRestore(t *testing.T) {
	ctx := testCtx(t)
	ws := t.TempDir()
	write(t, ws, "README.md", "# title\n\nintro\n")
	write(t, ws, "src/main.go", "package main\n\nfunc main() {}\n")
	write(t, ws, "src/old.go", "package main\n// old\n")
	write(t, ws, "run.sh", "#!/bin/sh\necho hi\n")
	write(t, ws, "tool.sh", "#!/bin/sh\n")
	write(t, ws, "docs/a/b/deep.txt", "deep\n")
	write(t, ws, "logo.png", "\x89PNG\r\n\x1a\n\x00\x00\x00binary")
	write(t, ws, "becomes-link", "a file\n")
	symlink(t, ws, "becomes-file", "README.md")
	symlink(t, ws, "link-to-src", "src")
	r := openRepo(t, ws, Options{})
	before, rep := snap(t, r)
	if rep.Updated != 10 || len(rep.Skipped) != 0 {
		t.Errorf("first report %+v, want every one of the 10 paths read and none left out", rep)
	}
	stateBefore := state(t, ws, false)

	// The turn.
	write(t, ws, "README.md", "# title\n\nintro, longer\nmore\n")
	write(t, ws, "src/new/util.go", "package new\n")
	remove(t, ws, "src/old.go")
	remove(t, ws, "docs")
	if err := os.Chmod(filepath.Join(ws, "tool.sh"), 0o755); err != nil {
		t.Fatal(err)
	}
	write(t, ws, "logo.png", "\x89PNG\r\n\x1a\n\x00\x00\x00other binary")
	remove(t, ws, "becomes-link")
	symlink(t, ws, "becomes-link", "/elsewhere")
	remove(t, ws, "becomes-file")
	write(t, ws, "becomes-file", "now a file\n")
	write(t, ws, "empty-dir-child/x", "x\n")
	after, rep := snap(t, r)
	if rep.Updated < 8 {
		t.Errorf("second report %+v, want at least the 8 changed paths read", rep)
	}
	stateAfter := state(t, ws, false)

	d, err := r.Diff(ctx, before, after, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	wantFiles := []File{
		{Path: "README.md", Status: StatusModified, Insertions: 2, Deletions: 1},
		{Path: "becomes-file", Status: StatusModified, Insertions: 1, Deletions: 1},
		{Path: "becomes-link", Status: StatusModified, Insertions: 1, Deletions: 1},
		{Path: "docs/a/b/deep.txt", Status: StatusDeleted, Deletions: 1},
		{Path: "empty-dir-child/x", Status: StatusAdded, Insertions: 1},
		{Path: "logo.png", Status: StatusModified, Binary: true},
		{Path: "src/new/util.go", Status: StatusAdded, Insertions: 1},
		{Path: "src/old.go", Status: StatusDeleted, Deletions: 2},
		{Path: "tool.sh", Status: StatusModified},
	}
	if diff := cmp.Diff(wantFiles, d.Files); diff != "" {
		t.Errorf("files (-want +got):\n%s", diff)
	}
	if want := (Changes{Files: 9, Insertions: 6, Deletions: 6}); d.Changes != want {
		t.Errorf("changes %+v, want %+v", d.Changes, want)
	}
	for _, s := range []string{"+intro, longer", "-intro", "+package new", "old mode 100644\nnew mode 100755",
		"Binary files a/logo.png and b/logo.png differ", "deleted file mode 100644"} {
		if !strings.Contains(d.Patch, s) {
			t.Errorf("patch lacks %q:\n%s", s, d.Patch)
		}
	}
	if strings.Contains(d.Patch, "other binary") || d.Truncated {
		t.Errorf("patch inlines the binary file or is cut (truncated %v):\n%s", d.Truncated, d.Patch)
	}
	c, err := r.Changes(ctx, before, after)
	if err != nil || c != d.Changes {
		t.Errorf("Changes = %+v, %v; want %+v", c, err, d.Changes)
	}

	res, err := r.Restore(ctx, before)
	if err != nil {
		t.Fatal(err)
	}
	sameState(t, "workspace after restoring the turn's start", stateBefore, state(t, ws, false))
	wantPaths := []string{"README.md", "becomes-file", "becomes-link", "docs/a/b/deep.txt", "empty-dir-child/x",
		"logo.png", "src/new/util.go", "src/old.go", "tool.sh"}
	if diff := cmp.Diff(wantPaths, res.Paths); diff != "" || res.Before != after || len(res.Kept) != 0 {
		t.Errorf("Restored %+v: paths (-want +got):\n%s", res, diff)
	}
	if id, _ := snap(t, r); id == after {
		t.Error("the snapshot after the restore is the turn's end")
	} else if d, err := r.Diff(ctx, before, id, Limits{}); err != nil || d.Changes.Files != 0 {
		t.Errorf("the snapshot after the restore differs from the turn's start: %+v, %v", d.Changes, err)
	}

	// And forward again: the restore is undone by restoring to Before.
	if _, err := r.Restore(ctx, res.Before); err != nil {
		t.Fatal(err)
	}
	sameState(t, "workspace after restoring the turn's end", stateAfter, state(t, ws, false))
}

// Only the files that changed are read again; an unchanged workspace
// gives the same ID.
func TestRepo_SnapshotIncremental(t *testing.T) {
	ws := t.TempDir()
	for i := range 50 {
		write(t, ws, fmt.Sprintf("d%d/f%d.txt", i%5, i), fmt.Sprintf("file %d\n", i))
	}
	r := openRepo(t, ws, Options{})
	first, rep := snap(t, r)
	if rep.Updated != 50 {
		t.Fatalf("first snapshot read %d paths, want 50", rep.Updated)
	}
	if again, rep := snap(t, r); again != first || rep.Updated != 0 {
		t.Errorf("unchanged workspace: %s (read %d), want %s (read 0)", again, rep.Updated, first)
	}
	write(t, ws, "d1/f1.txt", "changed\n")
	write(t, ws, "d2/new.txt", "new\n")
	remove(t, ws, "d3/f3.txt")
	next, rep := snap(t, r)
	if next == first || rep.Updated != 3 {
		t.Errorf("after 3 changes: %s (read %d), want a new ID and 3 read", next, rep.Updated)
	}
}

// Ignored paths (by .gitignore files at any depth), files over the size
// bound and nested repositories are left out and reported, never in a
// diff, and a restore leaves them alone; a recorded file that an ignore
// rule matches later stays recorded (its change is in the diff, and a
// restore brings it back).
func TestRepo_LeftOut(t *testing.T) {
	ctx := testCtx(t)
	ws := t.TempDir()
	write(t, ws, ".gitignore", "build/\n*.log\n")
	write(t, ws, "src/.gitignore", "*.tmp\n!keep.tmp\n")
	write(t, ws, "src/a.go", "package a\n")
	write(t, ws, "src/x.tmp", "scratch\n")
	write(t, ws, "src/keep.tmp", "kept\n")
	write(t, ws, "build/out/a.o", "object\n")
	write(t, ws, "run.log", "log\n")
	write(t, ws, "grows.txt", "small\n")
	write(t, ws, "was-tracked.txt", "tracked\n")
	big := strings.Repeat("x", DefaultMaxFileSize+1)
	write(t, ws, "big.bin", big)
	userGit(t, ws, "init", "-q", "vendor/lib")
	write(t, ws, "vendor/lib/lib.go", "package lib\n")
	r := openRepo(t, ws, Options{})
	before, rep := snap(t, r)
	want := []Skipped{
		{Path: "big.bin", Reason: ReasonTooLarge, Size: DefaultMaxFileSize + 1},
		{Path: "build/", Reason: ReasonIgnored},
		{Path: "run.log", Reason: ReasonIgnored},
		{Path: "src/x.tmp", Reason: ReasonIgnored},
		{Path: "vendor/lib/", Reason: ReasonRepository},
	}
	if diff := cmp.Diff(want, rep.Skipped); diff != "" {
		t.Errorf("skipped (-want +got):\n%s", diff)
	}
	recorded := treeOf(t, r, before)
	for _, p := range []string{".gitignore", "src/.gitignore", "src/a.go", "src/keep.tmp", "grows.txt", "was-tracked.txt"} {
		if recorded[p] == "" {
			t.Errorf("%s not recorded", p)
		}
	}
	if len(recorded) != 6 {
		t.Errorf("recorded %v, want the 6 paths that are not left out", recorded)
	}

	// The turn touches what is left out, grows a recorded file over the
	// bound, and ignores another, which it changes.
	write(t, ws, "build/out/a.o", "object 2\n")
	write(t, ws, "build/new.o", "new\n")
	write(t, ws, "run.log", "log 2\n")
	remove(t, ws, "src/x.tmp")
	write(t, ws, "big.bin", big+"y")
	write(t, ws, "vendor/lib/lib.go", "package lib // 2\n")
	write(t, ws, "grows.txt", big)
	write(t, ws, ".gitignore", "build/\n*.log\nwas-tracked.txt\n")
	write(t, ws, "was-tracked.txt", "changed\n")
	after, rep := snap(t, r)
	want = []Skipped{
		{Path: "big.bin", Reason: ReasonTooLarge, Size: DefaultMaxFileSize + 2},
		{Path: "build/", Reason: ReasonIgnored},
		{Path: "grows.txt", Reason: ReasonTooLarge, Size: DefaultMaxFileSize + 1},
		{Path: "run.log", Reason: ReasonIgnored},
		{Path: "vendor/lib/", Reason: ReasonRepository},
	}
	if diff := cmp.Diff(want, rep.Skipped); diff != "" {
		t.Errorf("skipped after the turn (-want +got):\n%s", diff)
	}
	d, err := r.Diff(ctx, before, after, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range d.Files {
		paths = append(paths, f.Path+" "+string(f.Status))
	}
	if want := []string{".gitignore modified", "grows.txt deleted", "was-tracked.txt modified"}; !slices.Equal(paths, want) {
		t.Errorf("diff lists %v, want %v", paths, want)
	}

	leftOut := state(t, ws, false)
	res, err := r.Restore(ctx, before)
	if err != nil {
		t.Fatal(err)
	}
	got := state(t, ws, false)
	if got[".gitignore"] != "file 0644 build/\n*.log\n" {
		t.Errorf(".gitignore not restored: %q", got[".gitignore"])
	}
	if got["was-tracked.txt"] != "file 0644 tracked\n" {
		t.Errorf("was-tracked.txt not restored: %q", got["was-tracked.txt"])
	}
	for _, p := range []string{".gitignore", "was-tracked.txt"} {
		delete(got, p)
		delete(leftOut, p)
	}
	sameState(t, "what snapshots leave out, after a restore", leftOut, got)
	if !slices.Equal(res.Paths, []string{".gitignore", "was-tracked.txt"}) || !slices.Equal(res.Kept, []string{"grows.txt"}) {
		t.Errorf("Restored %+v, want .gitignore and was-tracked.txt restored and grows.txt kept", res)
	}
}

// The size bound is configurable, and the report's list is bounded.
func TestRepo_Options(t *testing.T) {
	ws := t.TempDir()
	for i := range 5 {
		write(t, ws, fmt.Sprintf("f%d.bin", i), strings.Repeat("x", 100+i))
	}
	write(t, ws, "small.txt", "small\n")
	r := openRepo(t, ws, Options{MaxFileSize: 100, MaxReported: 2})
	id, rep := snap(t, r)
	want := Report{Updated: 2, SkippedOmitted: 2, Skipped: []Skipped{
		{Path: "f1.bin", Reason: ReasonTooLarge, Size: 101},
		{Path: "f2.bin", Reason: ReasonTooLarge, Size: 102},
	}}
	if diff := cmp.Diff(want, rep); diff != "" {
		t.Errorf("report (-want +got):\n%s", diff)
	}
	if got := treeOf(t, r, id); len(got) != 2 || got["f0.bin"] == "" || got["small.txt"] == "" {
		t.Errorf("recorded %v, want f0.bin and small.txt", got)
	}
}

// A Diff's patch and file list are bounded and say so; the totals count
// everything.
func TestRepo_DiffLimits(t *testing.T) {
	ctx := testCtx(t)
	ws := t.TempDir()
	r := openRepo(t, ws, Options{})
	before, _ := snap(t, r)
	for i := range 30 {
		write(t, ws, fmt.Sprintf("f%02d.txt", i), strings.Repeat(fmt.Sprintf("line of file %d\n", i), 20))
	}
	after, _ := snap(t, r)
	d, err := r.Diff(ctx, before, after, Limits{MaxPatchBytes: 1000, MaxFiles: 10})
	if err != nil {
		t.Fatal(err)
	}
	if !d.Truncated || len(d.Patch) > 1000 || len(d.Patch) < 500 || !strings.HasSuffix(d.Patch, "\n") {
		t.Errorf("patch of %d bytes, truncated %v: want cut at a line's end within 1000 bytes", len(d.Patch), d.Truncated)
	}
	if len(d.Files) != 10 || d.FilesOmitted != 20 || d.Files[9].Path != "f09.txt" {
		t.Errorf("%d files listed, %d omitted; want 10 and 20", len(d.Files), d.FilesOmitted)
	}
	if want := (Changes{Files: 30, Insertions: 600}); d.Changes != want {
		t.Errorf("changes %+v, want %+v", d.Changes, want)
	}
	full, err := r.Diff(ctx, before, after, Limits{})
	if err != nil || full.Truncated || !strings.HasPrefix(full.Patch, d.Patch) {
		t.Errorf("unbounded diff: truncated %v, %v; want the bounded patch as its start", full.Truncated, err)
	}
	same, err := r.Diff(ctx, after, after, Limits{})
	if err != nil || len(same.Files) != 0 || same.Patch != "" {
		t.Errorf("diff of a snapshot with itself: %+v, %v", same, err)
	}
}

// Only IDs of this repository's snapshots are accepted; nothing else
// reaches git's command line.
func TestRepo_UnknownSnapshot(t *testing.T) {
	ctx := testCtx(t)
	ws := t.TempDir()
	write(t, ws, "a.txt", "a\n")
	r := openRepo(t, ws, Options{})
	id, _ := snap(t, r)
	tree := ID(strings.TrimSpace(string(must(r.output(ctx, nil, "rev-parse", string(id)+"^{tree}")))))
	blob := ID(strings.TrimSpace(string(must(r.output(ctx, nil, "rev-parse", string(id)+":a.txt")))))
	other := openRepo(t, t.TempDir(), Options{})
	otherID, _ := snap(t, other)
	for _, bad := range []ID{"", "HEAD", "snapshots", "--output=x", id + "~1", ID(strings.Repeat("0", 40)),
		ID(strings.ToUpper(string(id))), tree, blob, otherID} {
		if _, err := r.Diff(ctx, id, bad, Limits{}); !errors.Is(err, ErrUnknownSnapshot) {
			t.Errorf("Diff to %q: %v, want ErrUnknownSnapshot", bad, err)
		}
		if _, err := r.Changes(ctx, bad, id); !errors.Is(err, ErrUnknownSnapshot) {
			t.Errorf("Changes from %q: %v, want ErrUnknownSnapshot", bad, err)
		}
		if _, err := r.Restore(ctx, bad); !errors.Is(err, ErrUnknownSnapshot) {
			t.Errorf("Restore to %q: %v, want ErrUnknownSnapshot", bad, err)
		}
	}
	if _, err := os.Stat(filepath.Join(ws, "x")); err == nil {
		t.Error("an ID reached git as an option")
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// Open refuses what it cannot work with, holds the shadow repository
// exclusively, and a reopened repository carries on from its last
// snapshot.
func TestOpen(t *testing.T) {
	ctx := testCtx(t)
	base := t.TempDir()
	ws := filepath.Join(base, "ws")
	write(t, ws, "a.txt", "a\n")
	symlink(t, base, "ws-link", "ws")
	write(t, base, "file", "x")
	for name, c := range map[string]struct{ dir, ws string }{
		"workspace is a symbolic link":   {filepath.Join(base, "s1"), filepath.Join(base, "ws-link")},
		"workspace missing":              {filepath.Join(base, "s2"), filepath.Join(base, "nowhere")},
		"workspace is a file":            {filepath.Join(base, "s3"), filepath.Join(base, "file")},
		"shadow inside the workspace":    {filepath.Join(ws, ".snapshots"), ws},
		"shadow inside, through a link":  {filepath.Join(base, "ws-link", "deeper", "snap"), ws},
		"workspace inside the shadow":    {base, ws},
		"shadow is the workspace itself": {ws, ws},
	} {
		if r, err := Open(ctx, c.dir, c.ws, Options{}); !errors.Is(err, ErrWorkspace) {
			if r != nil {
				_ = r.Close()
			}
			t.Errorf("%s: %v, want ErrWorkspace", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(ws, ".snapshots")); err == nil {
		t.Error("a refused Open created its directory in the workspace")
	}
	if _, err := Open(ctx, filepath.Join(base, "s4"), ws, Options{Git: filepath.Join(base, "no-git")}); !errors.Is(err, ErrGit) {
		t.Errorf("missing git: %v, want ErrGit", err)
	}
	write(t, base, "old-git", "#!/bin/sh\necho git version 2.20.1\n")
	if err := os.Chmod(filepath.Join(base, "old-git"), 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, filepath.Join(base, "s5"), ws, Options{Git: filepath.Join(base, "old-git")}); !errors.Is(err, ErrGit) {
		t.Errorf("git 2.20: %v, want ErrGit", err)
	}

	dir := filepath.Join(base, "snapshots")
	r, err := Open(ctx, dir, ws, Options{})
	if err != nil {
		t.Fatal(err)
	}
	id, _, err := r.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Open(ctx, dir, ws, Options{}); !errors.Is(err, ErrLocked) {
		t.Errorf("second Open: %v, want ErrLocked", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if _, _, err := r.Snapshot(ctx); !errors.Is(err, ErrClosed) {
		t.Errorf("Snapshot after Close: %v, want ErrClosed", err)
	}
	if _, err := r.Diff(ctx, id, id, Limits{}); !errors.Is(err, ErrClosed) {
		t.Errorf("Diff after Close: %v, want ErrClosed", err)
	}
	r = openRepoAt(t, dir, ws)
	if again, rep := snap(t, r); again != id || rep.Updated != 0 {
		t.Errorf("reopened, unchanged: %s (read %d), want %s (read 0)", again, rep.Updated, id)
	}
	if _, err := r.Diff(ctx, id, id, Limits{}); err != nil {
		t.Errorf("a snapshot taken before reopening: %v", err)
	}

	// The workspace replaced by a link after Open.
	if err := os.Rename(ws, ws+".real"); err != nil {
		t.Fatal(err)
	}
	symlink(t, base, "ws", "ws.real")
	if _, _, err := r.Snapshot(ctx); !errors.Is(err, ErrWorkspace) {
		t.Errorf("Snapshot of a workspace now a link: %v, want ErrWorkspace", err)
	}
	if _, err := r.Restore(ctx, id); !errors.Is(err, ErrWorkspace) {
		t.Errorf("Restore into a workspace now a link: %v, want ErrWorkspace", err)
	}
}

func openRepoAt(t *testing.T, dir, ws string) *Repo {
	t.Helper()
	r, err := Open(testCtx(t), dir, ws, Options{})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { _ = r.Close() })
	return r
}

// Snapshots of one repository run one at a time; another repository's
// run meanwhile.
func TestRepo_Serialized(t *testing.T) {
	ctx := testCtx(t)
	ws1, ws2 := t.TempDir(), t.TempDir()
	write(t, ws1, "a.txt", "a\n")
	write(t, ws2, "b.txt", "b\n")
	r1, r2 := openRepo(t, ws1, Options{}), openRepo(t, ws2, Options{})

	// Hold r1 as a snapshot in progress would.
	r1.sem <- struct{}{}
	waiting, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, _, err := r1.Snapshot(waiting)
		done <- err
	}()
	if _, _, err := r2.Snapshot(ctx); err != nil {
		t.Fatalf("the other repository's snapshot: %v", err)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("a snapshot waiting behind another: %v, want context.Canceled once cancelled", err)
	}
	<-r1.sem

	// Many at once on one repository, with the workspace changing.
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			if i%2 == 0 {
				if err := os.WriteFile(filepath.Join(ws1, fmt.Sprintf("f%d.txt", i)), []byte("x"), 0o644); err != nil {
					errs <- err
					return
				}
			}
			if _, _, err := r1.Snapshot(ctx); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	id, rep := snap(t, r1)
	if rep.Updated != 0 || len(treeOf(t, r1, id)) != 9 {
		t.Errorf("final snapshot read %d, recorded %v; want 0 read and the 9 files", rep.Updated, treeOf(t, r1, id))
	}
}

// A snapshot that reads many files stores them as one pack, records the
// same as file by file would, and leaves the index's stat data filled in
// so the next snapshot is incremental.
func TestRepo_SnapshotBulk(t *testing.T) {
	ctx := testCtx(t)
	ws := t.TempDir()
	n := bulkFiles + 44
	for i := range n {
		write(t, ws, fmt.Sprintf("d%d/f%03d.txt", i%7, i), fmt.Sprintf("file %d\n", i))
	}
	if err := os.Chmod(filepath.Join(ws, "d0/f000.txt"), 0o755); err != nil {
		t.Fatal(err)
	}
	symlink(t, ws, "link", "d1/f001.txt")
	write(t, ws, "big.bin", strings.Repeat("x", 2000))
	r := openRepo(t, ws, Options{MaxFileSize: 1000})
	first, rep := snap(t, r)
	if rep.Updated != n+1 || len(rep.Skipped) != 1 || rep.Skipped[0].Path != "big.bin" {
		t.Errorf("first report read %d, left out %v; want %d read and big.bin left out", rep.Updated, rep.Skipped, n+1)
	}
	rec := treeOf(t, r, first)
	if len(rec) != n+1 || rec["d0/f000.txt"] != "100755" || rec["d1/f001.txt"] != "100644" || rec["link"] != "120000" {
		t.Errorf("recorded %d paths (d0/f000.txt %s, link %s), want %d with their modes", len(rec), rec["d0/f000.txt"], rec["link"], n+1)
	}
	if got := blobOf(t, r, first, "d6/f293.txt"); got != "file 293\n" {
		t.Errorf("d6/f293.txt recorded as %q", got)
	}
	if got := blobOf(t, r, first, "link"); got != "d1/f001.txt" {
		t.Errorf("link recorded as %q", got)
	}
	packs, _ := filepath.Glob(filepath.Join(r.dir, "objects", "pack", "*.pack"))
	loose, _ := filepath.Glob(filepath.Join(r.dir, "objects", "??", "*"))
	if len(packs) != 1 || len(loose) > 10 {
		t.Errorf("%d packs and %d loose objects, want the files in one pack", len(packs), len(loose))
	}
	if again, rep := snap(t, r); again != first || rep.Updated != 0 {
		t.Errorf("unchanged after a bulk snapshot: read %d paths, want 0", rep.Updated)
	}
	inD3, _ := filepath.Glob(filepath.Join(ws, "d3", "*"))
	write(t, ws, "d2/f002.txt", "changed\n")
	remove(t, ws, "d3")
	next, rep := snap(t, r)
	if rep.Updated != 1+len(inD3) {
		t.Errorf("after a small change read %d paths, want %d", rep.Updated, 1+len(inD3))
	}
	if _, err := r.Restore(ctx, first); err != nil {
		t.Fatal(err)
	}
	if d, err := r.Diff(ctx, next, first, Limits{}); err != nil || d.Changes.Files != 1+len(inD3) {
		t.Errorf("diff of the restore: %+v, %v; want %d files", d.Changes, err, 1+len(inD3))
	}
	if again, rep := snap(t, r); rep.Updated != 0 || treeOf(t, r, again)["d3/f003.txt"] == "" {
		t.Errorf("after the restore: read %d paths, recorded %d", rep.Updated, len(treeOf(t, r, again)))
	}
}

// An ignore file written during a turn (here "*", which also matches
// itself) never hides or fakes a change: the files a snapshot recorded
// stay recorded, so the turn's diff calls them modified (not deleted), and
// a restore brings back every file the target snapshot holds whatever the
// ignore files say by then, ignored files in the way included; the files
// it writes are recorded again.
func TestRepo_IgnoreFileWrittenInATurn(t *testing.T) {
	ctx := testCtx(t)
	ws := t.TempDir()
	r := openRepo(t, ws, Options{})
	empty, _ := snap(t, r)
	write(t, ws, "a.txt", "a\n")
	write(t, ws, "sub/s.txt", "s\n")
	t1, _ := snap(t, r)
	t1State := state(t, ws, false)

	write(t, ws, ".gitignore", "*\n")
	write(t, ws, "a.txt", "a\nb\n")
	write(t, ws, "sub/s.txt", "evil\n")
	write(t, ws, "sub/n.txt", "new\n")
	t2, rep := snap(t, r)
	d, err := r.Diff(ctx, t1, t2, Limits{})
	if err != nil {
		t.Fatal(err)
	}
	var files []string
	for _, f := range d.Files {
		files = append(files, f.Path+" "+string(f.Status))
	}
	if want := []string{"a.txt modified", "sub/s.txt modified"}; !slices.Equal(files, want) {
		t.Errorf("the turn's diff lists %v, want %v", files, want)
	}
	if want := []Skipped{{Path: ".gitignore", Reason: ReasonIgnored}, {Path: "sub/n.txt", Reason: ReasonIgnored}}; !slices.Equal(rep.Skipped, want) {
		t.Errorf("skipped %v, want %v", rep.Skipped, want)
	}

	// Back to before the first turn: what it recorded goes; what was never
	// recorded (ignored since it appeared) stays.
	res, err := r.Restore(ctx, empty)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"a.txt", "sub/s.txt"}; !slices.Equal(res.Paths, want) || len(res.Kept) != 0 {
		t.Errorf("restore to the empty snapshot: %+v, want %v removed", res, want)
	}
	if got, want := state(t, ws, false), map[string]string{".gitignore": "file 0644 *\n", "sub": "dir", "sub/n.txt": "file 0644 new\n"}; !maps.Equal(got, want) {
		t.Errorf("after the restore to empty: %v, want %v", got, want)
	}

	// Forward again to after the first turn, while "*" ignores everything:
	// every file comes back, and is recorded.
	remove(t, ws, "sub/n.txt")
	res, err = r.Restore(ctx, t1)
	if err != nil {
		t.Fatal(err)
	}
	want := maps.Clone(t1State)
	want[".gitignore"] = "file 0644 *\n"
	sameState(t, "after the restore to the first turn, under *", want, state(t, ws, false))
	if len(res.Kept) != 0 {
		t.Errorf("kept %v", res.Kept)
	}
	now, _ := snap(t, r)
	if d, err := r.Diff(ctx, t1, now, Limits{}); err != nil || len(d.Files) != 0 {
		t.Errorf("the restored files are not recorded as they are: %+v %v", d.Files, err)
	}

	// A file deleted in a turn, then made again under the ignore rule (so
	// never recorded), and an ignored file where a folder goes: a restore
	// replaces both.
	remove(t, ws, "a.txt")
	remove(t, ws, "sub")
	snap(t, r)
	write(t, ws, "a.txt", "junk\n")
	write(t, ws, "sub", "a file where a folder was\n")
	_, rep = snap(t, r)
	if !slices.Contains(rep.Skipped, Skipped{Path: "a.txt", Reason: ReasonIgnored}) {
		t.Fatalf("the remade a.txt is not left out as ignored: %v", rep.Skipped)
	}
	res, err = r.Restore(ctx, t1)
	if err != nil {
		t.Fatal(err)
	}
	sameState(t, "after replacing ignored files in the way", want, state(t, ws, false))
	if len(res.Kept) != 0 {
		t.Errorf("kept %v", res.Kept)
	}
}
