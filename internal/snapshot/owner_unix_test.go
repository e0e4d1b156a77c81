//go:build unix

package snapshot

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A host run as root restores into a workspace another user owns (an
// agent running as a uid of its own): the files, folders and links it
// creates are that user's, so the agent may change them again.
func TestRestoreGivesTheWorkspaceOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("giving files to another user needs root")
	}
	ws := t.TempDir()
	write(t, ws, "a/b/file.txt", "one\n")
	symlink(t, ws, "a/link", "b")
	if err := os.Chown(ws, 4321, 4322); err != nil {
		t.Fatal(err)
	}
	r := openRepo(t, ws, Options{})
	before, _ := snap(t, r)
	remove(t, ws, "a")
	snap(t, r)
	if _, err := r.Restore(testCtx(t), before); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"a", "a/b", "a/b/file.txt", "a/link"} {
		fi, err := os.Lstat(filepath.Join(ws, p))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 4321 || st.Gid != 4322 {
			t.Errorf("%s: owned by %d:%d", p, st.Uid, st.Gid)
		}
	}
}
