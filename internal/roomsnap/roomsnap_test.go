package roomsnap

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agenthost/agenthost/internal/snapshot"
	"github.com/agenthost/agenthost/room"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func write(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestTurnChangesDiffRevertAndAJournalThatSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	p := room.SnapshotPlace{Room: "r", Dir: filepath.Join(dir, "r", "snapshots"), Workspace: filepath.Join(dir, "r", "workspace")}
	if err := os.MkdirAll(p.Workspace, 0o700); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(p.Workspace, "keep.txt"), "one\ntwo\n")
	s := New(Options{})
	ctx := t.Context()
	if err := s.Before(ctx, p, "t1"); err != nil {
		t.Fatal(err)
	}
	write(t, filepath.Join(p.Workspace, "new.txt"), "hello\n")
	write(t, filepath.Join(p.Workspace, "keep.txt"), "one\n2\n")
	c, err := s.After(ctx, p, "t1")
	if err != nil || c != (room.Changes{Files: 2, Insertions: 2, Deletions: 1}) {
		t.Fatalf("changes %+v %v", c, err)
	}
	if _, err := s.After(ctx, p, "t_unknown"); !errors.Is(err, room.ErrNotFound) {
		t.Fatalf("after of an unknown turn: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Before(ctx, p, "t2"); !errors.Is(err, snapshot.ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}

	// A new host reads the journal.
	s = New(Options{})
	defer s.Close()
	d, err := s.Diff(ctx, p, "t1")
	if err != nil || len(d.Files) != 2 || d.Files[0].Path != "keep.txt" || d.Files[1].Path != "new.txt" ||
		d.Files[1].Status != "added" || !strings.Contains(d.Patch, "+hello") {
		t.Fatalf("diff %+v %v", d, err)
	}
	if _, err := s.Diff(ctx, p, "t_unknown"); !errors.Is(err, room.ErrNotFound) {
		t.Fatalf("diff of an unknown turn: %v", err)
	}
	if _, err := s.Revert(ctx, p, "t_unknown"); !errors.Is(err, room.ErrNotFound) {
		t.Fatalf("revert of an unknown turn: %v", err)
	}
	res, err := s.Revert(ctx, p, "t1")
	if err != nil || strings.Join(res.Files, ",") != "keep.txt,new.txt" {
		t.Fatalf("revert %+v %v", res, err)
	}
	if _, err := os.Stat(filepath.Join(p.Workspace, "new.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("new.txt after revert: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(p.Workspace, "keep.txt")); string(b) != "one\ntwo\n" {
		t.Fatalf("keep.txt after revert: %q", b)
	}
}

// diff_revert (review-api F11): a file name that is not UTF-8 (or starts
// with a double quote) is named Go-quoted in a diff and a revert, which
// strconv.Unquote turns back into its bytes (JSON would make it U+FFFD);
// other names are as they are.
func TestPathsThatAreNotUTF8AreQuoted(t *testing.T) {
	dir := t.TempDir()
	p := room.SnapshotPlace{Room: "r", Dir: filepath.Join(dir, "r", "snapshots"), Workspace: filepath.Join(dir, "r", "workspace")}
	if err := os.MkdirAll(p.Workspace, 0o700); err != nil {
		t.Fatal(err)
	}
	s := New(Options{})
	defer s.Close()
	ctx := t.Context()
	if err := s.Before(ctx, p, "t1"); err != nil {
		t.Fatal(err)
	}
	names := []string{"\xff\xfe.txt", `"quoted".txt`, "plain é.txt"}
	for _, n := range names {
		write(t, filepath.Join(p.Workspace, n), "x\n")
	}
	if _, err := s.After(ctx, p, "t1"); err != nil {
		t.Fatal(err)
	}
	d, err := s.Diff(ctx, p, "t1")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, f := range d.Files {
		got = append(got, f.Path)
	}
	res, err := s.Revert(ctx, p, "t1")
	if err != nil {
		t.Fatal(err)
	}
	for _, list := range [][]string{got, res.Files} {
		var back []string
		for _, n := range list {
			if strings.HasPrefix(n, `"`) {
				u, err := strconv.Unquote(n)
				if err != nil {
					t.Fatalf("%q: %v", n, err)
				}
				n = u
			} else if !utf8.ValidString(n) {
				t.Fatalf("%q is not UTF-8", n)
			}
			back = append(back, n)
		}
		slices.Sort(back)
		want := slices.Sorted(slices.Values(names))
		if !slices.Equal(back, want) {
			t.Fatalf("names %q, want %q", list, want)
		}
	}
	if !slices.Contains(got, "plain é.txt") || !slices.Contains(got, `"\xff\xfe.txt"`) {
		t.Fatalf("names %q", got)
	}
}
